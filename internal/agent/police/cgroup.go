// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package police

import (
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// containerOf reads a process's /proc/<pid>/cgroup: the pod (by UID) and
// the container (runtime ID, "" if the path names none) it runs in; ok is
// false for a process outside any pod.
//
// The kubelet names a pod's cgroup after its UID, in either driver:
//
//	cgroupfs: .../kubepods/burstable/pod<uid>/<container>
//	systemd:  .../kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/<container>
//
// and the runtime names the container's below it: containerd
// "<id>" (cgroupfs) or "cri-containerd-<id>.scope" (systemd), CRI-O
// "crio-<id>" or "crio-<id>.scope", cri-dockerd "<id>" or
// "docker-<id>.scope". Under cgroup v1 every hierarchy has a line: any that
// names a pod will do. The path may be relative to the agent's cgroup
// namespace ("/../../kubepods-..."), and may go on below the container's
// (a process that made cgroups of its own): segments are matched, not
// the whole path.
func containerOf(cgroup string) (pod types.UID, container string, ok bool) {
	for line := range strings.SplitSeq(cgroup, "\n") {
		// hierarchy-ID:controllers:path; the path may hold colons.
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		segs := strings.Split(parts[2], "/")
		for i, s := range segs {
			uid, found := podSegment(s)
			if !found {
				continue
			}
			if i+1 < len(segs) {
				container = containerSegment(segs[i+1])
			}
			return uid, container, true
		}
	}
	return "", "", false
}

// podSegment reads a pod's cgroup name: "pod<uid>" (cgroupfs) or
// "kubepods[-<qos>]-pod<uid with _>.slice" (systemd).
func podSegment(s string) (types.UID, bool) {
	var uid string
	switch {
	case strings.HasPrefix(s, "pod"):
		uid = s[len("pod"):]
	case strings.HasPrefix(s, "kubepods") && strings.HasSuffix(s, ".slice"):
		i := strings.LastIndex(s, "-pod")
		if i < 0 {
			return "", false
		}
		uid = strings.ReplaceAll(strings.TrimSuffix(s[i+len("-pod"):], ".slice"), "_", "-")
	default:
		return "", false
	}
	if !isUID(uid) {
		return "", false
	}
	return types.UID(uid), true
}

// containerSegment reads a container's runtime ID from its cgroup's name;
// "" for a name that is none (CRI-O's conmon, a sandbox's own cgroup
// shapes not listed above).
func containerSegment(s string) string {
	s = strings.TrimSuffix(s, ".scope")
	for _, prefix := range []string{"cri-containerd-", "crio-", "docker-"} {
		if strings.HasPrefix(s, prefix) {
			s = s[len(prefix):]
			break
		}
	}
	if len(s) != 64 || strings.Trim(s, "0123456789abcdef") != "" {
		return ""
	}
	return s
}

// isUID: 36 characters, hex digits and dashes at 8-4-4-4-12.
func isUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !strings.ContainsRune("0123456789abcdef", c) {
				return false
			}
		}
	}
	return true
}
