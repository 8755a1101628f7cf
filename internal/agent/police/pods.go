// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package police

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// PodOf reads a process's /proc/<pid>/cgroup as the police does: the pod
// (by UID) and container (runtime ID, "" if the path names none) it runs
// in; ok is false for a process outside any pod. For the agent's other
// reader of GPU processes, the per-pod metrics.
func PodOf(cgroup string) (pod types.UID, container string, ok bool) { return containerOf(cgroup) }

// ContainerClaims names the container of a pod with that runtime ID and
// the ResourceClaims it uses, as the police maps a process; for a
// container the pod's status does not list yet, "" and every claim of
// the pod.
func ContainerClaims(pod *corev1.Pod, containerID string) (string, []string) {
	return containerClaims(pod, containerID)
}
