// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/internal/waitfor"
)

// ExampleClaim reads a ResourceClaim from deploy/examples/<file>.
func ExampleClaim(file string) (*resourceapi.ResourceClaim, error) {
	dir, err := DeployDir()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dir, "examples", file))
	if err != nil {
		return nil, err
	}
	var claim resourceapi.ResourceClaim
	if err := yaml.UnmarshalStrict(data, &claim); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &claim, nil
}

// TemplateFor turns a claim into a ResourceClaimTemplate of the same name, so
// that each pod gets its own claim from it.
func TemplateFor(claim *resourceapi.ResourceClaim) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: claim.Name},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: claim.Spec},
	}
}

// PodWithClaimTemplate is a test-app pod whose container uses one claim made
// from the named template (pod claim name "devices").
func PodWithClaimTemplate(name, template string, paths ...string) *corev1.Pod {
	pod := TestAppPod(name, paths...)
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "devices", ResourceClaimTemplateName: &template}}
	pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "devices"}}
	return pod
}

// PodWithClaim is a test-app pod whose claim "devices" is the directly
// referenced ResourceClaim claim.
func PodWithClaim(name, claim string, paths ...string) *corev1.Pod {
	pod := TestAppPod(name, paths...)
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "devices", ResourceClaimName: &claim}}
	pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "devices"}}
	return pod
}

// PodWithExtendedResource is a test-app pod, without claims, whose
// container asks for count of an extended resource (limits, and so
// requests) as pods written for a device plugin do.
func PodWithExtendedResource(name, resource string, count int64, paths ...string) *corev1.Pod {
	pod := TestAppPod(name, paths...)
	q := *apiresource.NewQuantity(count, apiresource.DecimalSI)
	pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(resource): q}
	return pod
}

// WaitPodClaimAllocated waits until the claim generated for the pod's claim
// "devices" is allocated and reserved for the pod, and the pod is bound to a
// node: the scheduler's work, done before the kubelet prepares anything.
func (n *Node) WaitPodClaimAllocated(ctx context.Context, ns, podName string, timeout time.Duration) (*resourceapi.ResourceClaim, *corev1.Pod, error) {
	return n.waitClaimAllocated(ctx, ns, podName, timeout, func(pod *corev1.Pod) string {
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.Name == "devices" && s.ResourceClaimName != nil {
				return *s.ResourceClaimName
			}
		}
		return ""
	})
}

// WaitPodExtendedClaimAllocated is WaitPodClaimAllocated for the claim
// the scheduler made for the pod's extended resources (named in
// status.extendedResourceClaimStatus).
func (n *Node) WaitPodExtendedClaimAllocated(ctx context.Context, ns, podName string, timeout time.Duration) (*resourceapi.ResourceClaim, *corev1.Pod, error) {
	return n.waitClaimAllocated(ctx, ns, podName, timeout, func(pod *corev1.Pod) string {
		if st := pod.Status.ExtendedResourceClaimStatus; st != nil {
			return st.ResourceClaimName
		}
		return ""
	})
}

// waitClaimAllocated waits until the pod's claim (named by claimOf) is
// allocated and reserved and the pod bound.
func (n *Node) waitClaimAllocated(ctx context.Context, ns, podName string, timeout time.Duration, claimOf func(*corev1.Pod) string) (*resourceapi.ResourceClaim, *corev1.Pod, error) {
	var pod *corev1.Pod
	var claim *resourceapi.ResourceClaim
	err := waitfor.Check(ctx, "claim of pod "+ns+"/"+podName+" allocated", timeout, func() error {
		var err error
		if pod, err = n.Admin.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{}); err != nil {
			return waitfor.Stop(err)
		}
		claimName := claimOf(pod)
		if claimName == "" || pod.Spec.NodeName == "" {
			return errors.New("pod not bound or no claim named")
		}
		if claim, err = n.Admin.ResourceV1().ResourceClaims(ns).Get(ctx, claimName, metav1.GetOptions{}); err != nil {
			return waitfor.Stop(err)
		}
		if claim.Status.Allocation == nil || len(claim.Status.ReservedFor) == 0 {
			return fmt.Errorf("claim %q not allocated and reserved", claimName)
		}
		return nil
	})
	if err != nil {
		return nil, pod, fmt.Errorf("%w: %s", err, n.describePod(ns, podName, pod))
	}
	return claim, pod, nil
}
