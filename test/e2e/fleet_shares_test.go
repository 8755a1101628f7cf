// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// A fleet full of shares (HWDRA_FLEET_SHARES): before the scheduler starts,
// K claims are allocated and bound as the scheduler would have done it,
// half GPU shares and half VF shares, each with a pod bound to its node.
// The one-device model gets the same claims as whole GPUs and VFs. The
// scheduler's allocator reads them like any allocated claim: our shares
// are shared allocations (allowMultipleAllocations, a share ID each), the
// one-device model's are exclusive ones.

// Each share asks for what fillShare gives it: 8Gi and 10% of a GPU (ten
// per GPU), 10G of a PF (as many per PF as it has VFs and bandwidth).
var (
	shareMemory    = resource.MustParse("8Gi")
	shareCompute   = resource.MustParse("10")
	shareBandwidth = resource.MustParse("10G")
	shareVF        = resource.MustParse("1")
)

// fillTarget is a device the fill allocates from, and how many of the
// fill's claims it takes.
type fillTarget struct {
	node, driver, device string
	gpu                  bool
	room                 int
	shared               bool // allowMultipleAllocations: each claim a share
}

// fillTargets are a node's devices that the fill may allocate, in slice
// order (first fit, as the allocator picks): per driver its shareable
// devices (our GPU share devices and shared PFs), or where it has none
// (the one-device model) its whole GPUs and VFs.
func fillTargets(node string, slices []resourceapi.ResourceSlice) []fillTarget {
	all := fillCandidates(node, slices)
	shareable := map[bool]bool{}
	for _, t := range all {
		shareable[t.gpu] = shareable[t.gpu] || t.shared
	}
	var out []fillTarget
	for _, t := range all {
		if t.shared == shareable[t.gpu] {
			out = append(out, t)
		}
	}
	return out
}

// fillCandidates are a node's shareable devices, whole GPUs and VFs.
func fillCandidates(node string, slices []resourceapi.ResourceSlice) []fillTarget {
	var out []fillTarget
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			t := fillTarget{node: node, driver: s.Spec.Driver, device: d.Name, gpu: s.Spec.Driver == device.GPUDriver,
				shared: d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations}
			kind := ""
			if a, ok := d.Attributes[device.AttrType]; ok && a.StringValue != nil {
				kind = *a.StringValue
			}
			switch {
			case t.gpu && t.shared && kind == device.KindShare:
				t.room = min(fits(d.Capacity[device.GPUCapMemory].Value, shareMemory), fits(d.Capacity[device.GPUCapCompute].Value, shareCompute))
			case t.gpu && !t.shared && kind == device.KindGPU:
				t.room = 1
			case !t.gpu && t.shared:
				t.room = min(fits(d.Capacity[device.NICCapBandwidth].Value, shareBandwidth), fits(d.Capacity[device.NICCapVFs].Value, shareVF))
			case !t.gpu && !t.shared:
				t.room = 1
			}
			if t.room > 0 {
				out = append(out, t)
			}
		}
	}
	return out
}

func fits(have, each resource.Quantity) int {
	if each.IsZero() {
		return 0
	}
	return int(have.AsApproximateFloat64() / each.AsApproximateFloat64())
}

// fillPlan spreads k claims, half GPU and half VF, over the nodes in turn,
// first fit within a node. It returns the devices, one per claim, and how
// many of each it placed (fewer than asked where devices run out: the
// one-device model holds one claim per GPU, and at most max of them, so
// the measured pods still fit).
func fillPlan(targets map[string][]fillTarget, k, maxGPU int) (plan []fillTarget, gpus, vfs int) {
	nodes := make([]string, 0, len(targets))
	for n := range targets {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, gpu := range []bool{true, false} {
		want := k / 2
		if gpu {
			want = min(k/2, maxGPU)
		}
		placed := 0
		for progress := true; placed < want && progress; {
			progress = false
			for _, n := range nodes {
				if placed == want {
					break
				}
				for i := range targets[n] {
					t := &targets[n][i]
					if t.gpu == gpu && t.room > 0 {
						t.room--
						plan = append(plan, *t)
						placed++
						progress = true
						break
					}
				}
			}
		}
		if gpu {
			gpus = placed
		} else {
			vfs = placed
		}
	}
	return plan, gpus, vfs
}

// fillShare creates the i-th claim of the fill on t, a pod bound to t's
// node that reserves it, and the claim's allocation.
func fillShare(ctx context.Context, cs kubernetes.Interface, ns string, i int, t fillTarget) error {
	name := fmt.Sprintf("fill-%05d", i)
	class := map[[2]bool]string{{true, true}: "share.gpu.hwdra.io", {true, false}: "gpu.hwdra.io",
		{false, true}: "vf-share.sriov.hwdra.io", {false, false}: "vf.sriov.hwdra.io"}[[2]bool{t.gpu, t.shared}]
	consumed := map[resourceapi.QualifiedName]resource.Quantity{device.GPUCapMemory: shareMemory, device.GPUCapCompute: shareCompute}
	if !t.gpu {
		consumed = map[resourceapi.QualifiedName]resource.Quantity{device.NICCapBandwidth: shareBandwidth, device.NICCapVFs: shareVF}
	}
	req := resourceapi.DeviceRequest{Name: "dev", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
	}}
	result := resourceapi.DeviceRequestAllocationResult{Request: "dev", Driver: t.driver, Pool: t.node, Device: t.device}
	if t.shared {
		req.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: consumed}
		shareID := uuid.NewUUID()
		result.ShareID, result.ConsumedCapacity = &shareID, consumed
	}
	claim, err := cs.ResourceV1().ResourceClaims(ns).Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("fill claim %s: %w", name, err)
	}
	pod, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:       t.node,
			Containers:     []corev1.Container{{Name: "c", Image: "registry.local/pause:v1", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "c"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "c", ResourceClaimName: &name}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("fill pod %s: %w", name, err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{result}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{
			Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{t.node},
		}}}}},
	}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name, UID: pod.UID}}
	if _, err := cs.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("fill claim %s: allocation: %w", name, err)
	}
	return nil
}

// fillFleet allocates p.shares claims on the targets before the scheduler
// starts (fillPlan) and says what it allocated. The one-device model keeps
// a tenth more GPUs free than the run's GPU pods need.
func fillFleet(ctx context.Context, t *testing.T, n *framework.Node, cs kubernetes.Interface, model fleetModel, targets map[string][]fillTarget, p fleetParams) string {
	t.Helper()
	maxGPU := p.shares
	if model.name == oneDeviceModel.name {
		gpus := 0
		for _, ts := range targets {
			for _, tg := range ts {
				if tg.gpu {
					gpus += tg.room
				}
			}
		}
		gpuPods := p.pods * (len(fleetKinds) - 1) / len(fleetKinds)
		maxGPU = max(0, gpus-gpuPods-gpuPods/10)
	}
	plan, gpus, vfs := fillPlan(targets, p.shares, maxGPU)
	ns := n.CreateNamespace(t, "fill")
	began := time.Now()
	if err := parallel(len(plan), func(i int) error { return fillShare(ctx, cs, ns, i, plan[i]) }); err != nil {
		t.Fatal(err)
	}
	what := "shares"
	if model.name == oneDeviceModel.name {
		what = "whole devices"
	}
	fill := fmt.Sprintf("%d GPU + %d VF %s allocated first", gpus, vfs, what)
	t.Logf("%s: %s in %v", model.name, fill, time.Since(began).Round(time.Millisecond))
	return fill
}
