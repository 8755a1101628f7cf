// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// fleetHardware is the fleet's mix, per 20 nodes: 18 DGX H100s (8 GPUs,
// 10 ConnectX-7 ports with VFs), one vGPU host, one NIC-only node. Enough
// GPUs (7.3 a node) that the one-device model fits every GPU pod too.
func fleetHardware(i int) string {
	switch i % 20 {
	case 9:
		return "mock:h100-vgpu"
	case 19:
		return "mock:cx7"
	}
	return "mock:dgx-h100"
}

// fleetModel says what a node publishes for its inventory, and which
// DeviceClasses the run installs (classes: the chart's, changed; nil:
// the chart's).
type fleetModel struct {
	name    string
	slices  func(node string, inv hw.Inventory) []resourceapi.ResourceSlice
	classes func([]*resourceapi.DeviceClass) []*resourceapi.DeviceClass
}

// oursModel is what the agent publishes: ForNode with the default
// configuration and every feature, as `hwdra slices` prints it.
var oursModel = fleetModel{name: "ours", slices: func(node string, inv hw.Inventory) []resourceapi.ResourceSlice {
	return modelSlices(node, inv, config.Default())
}}

// modelSlices are ForNode's objects for a configuration, in hwdra slices'
// order.
func modelSlices(node string, inv hw.Inventory, cfg *config.AgentConfig) []resourceapi.ResourceSlice {
	res, _ := resources.ForNode(node, inv, cfg, device.AllFeatures, hw.Health{})
	var out []resourceapi.ResourceSlice
	for _, d := range []string{device.GPUDriver, device.NICDriver} { // hwdra slices' order
		if r, ok := res[d]; ok {
			out = append(out, resources.Objects(d, node, r)...)
		}
	}
	return out
}

// leanModel is what the agent publishes with gpus.migProfiles limited to
// the profiles most claims ask for (1g.*, 3g.40gb, 7g.80gb, no +me
// variants), as slices/resources' fleet benchmark measures it.
var leanModel = configModel("lean", `{include: ["1g.*", 3g.40gb, 7g.80gb], exclude: ["*+me*", 1g.20gb]}`)

// plainModel offers every plain MIG profile and none of the media
// extension variants (+me, -me).
var plainModel = configModel("plain", `{exclude: ["*+me*", "*-me*"]}`)

// configModel is what the agent publishes with gpus.migProfiles set to
// migProfiles (YAML).
func configModel(name, migProfiles string) fleetModel {
	cfg, err := config.Parse([]byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\ngpus:\n  migProfiles: " + migProfiles + "\n"))
	if err != nil {
		panic(fmt.Sprintf("fleet model %s: %v", name, err)) // a constant
	}
	return fleetModel{name: name, slices: func(node string, inv hw.Inventory) []resourceapi.ResourceSlice {
		return modelSlices(node, inv, cfg)
	}}
}

// oneDeviceModel is the same hardware without any DRA feature: one device
// per GPU and per VF, no counters, no shares (fleet_bench_test.go's
// simplest model).
var oneDeviceModel = fleetModel{name: "one-device", slices: func(node string, inv hw.Inventory) []resourceapi.ResourceSlice {
	var out []resourceapi.ResourceSlice
	if len(inv.GPUs) > 0 {
		out = append(out, resources.Objects(device.GPUDriver, node, resources.GPU(node, inv.GPUs, device.Features{}))...)
	}
	if len(inv.PFs) > 0 {
		offers, _ := config.Default().Resolve(inv.PFs)
		nic, _ := resources.NIC(node, offers, device.Features{})
		out = append(out, resources.Objects(device.NICDriver, node, nic)...)
	}
	return out
}}

// nicFirstModel measures what renaming the NIC driver would buy (not
// published): our slices with the NIC driver's name sorting before the GPU
// driver's, and the NIC classes selecting it. The allocator visits pools by
// driver name, so a VF-share claim no longer evaluates its class on every
// GPU device of the node first. Attributes and capacities keep their
// names.
var nicFirstModel = fleetModel{name: "nic-first",
	slices: func(node string, inv hw.Inventory) []resourceapi.ResourceSlice {
		out := oursModel.slices(node, inv)
		for i := range out {
			if out[i].Spec.Driver == device.NICDriver {
				out[i].Spec.Driver = nicFirstDriver
				out[i].Name = strings.Replace(out[i].Name, device.NICDriver, nicFirstDriver, 1)
			}
		}
		return out
	},
	classes: func(in []*resourceapi.DeviceClass) []*resourceapi.DeviceClass {
		out := make([]*resourceapi.DeviceClass, 0, len(in))
		for _, c := range in {
			c = c.DeepCopy()
			for i := range c.Spec.Selectors {
				e := c.Spec.Selectors[i].CEL
				e.Expression = strings.ReplaceAll(e.Expression, `"`+device.NICDriver+`"`, `"`+nicFirstDriver+`"`)
			}
			out = append(out, c)
		}
		return out
	},
}

// nicFirstDriver sorts before gpu.hwdra.io.
const nicFirstDriver = "dra-sriov.hwdra.io"

// probeOnce opens each mock profile once; nodes of a profile share it.
type inventories map[string]hw.Inventory

func (c inventories) get(t *testing.T, spec string) hw.Inventory {
	t.Helper()
	if inv, ok := c[spec]; ok {
		return inv
	}
	inv, err := backend.Probe(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	c[spec] = inv
	return inv
}

// parallel runs f(0..n-1) on 32 workers and returns the first error.
func parallel(n int, f func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// fleetKind is a kind of pod: its claim (nil: the extended resource) in
// our model and in the one-device model.
type fleetKind struct {
	name      string
	ours, one []resourceapi.DeviceRequest
}

func capacityRequest(name, class string, capacity map[string]string) resourceapi.DeviceRequest {
	r := allocate.Request(name, class, 1, "")
	r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
	for k, v := range capacity {
		r.Exactly.Capacity.Requests[resourceapi.QualifiedName(k)] = resource.MustParse(v)
	}
	return r
}

func profileIs(p string) string { return `device.attributes["gpu.hwdra.io"].profile == "` + p + `"` }

// fleetKinds are scheduled in this order (pods are named so).
var fleetKinds = func() []fleetKind {
	gpu := []resourceapi.DeviceRequest{allocate.Request("dev", "gpu.hwdra.io", 1, "")}
	vf := []resourceapi.DeviceRequest{allocate.Request("dev", "vf.sriov.hwdra.io", 1, "")}
	return []fleetKind{
		{"gpu", gpu, gpu},
		{"mig-1g.10gb", []resourceapi.DeviceRequest{allocate.Request("dev", "mig.gpu.hwdra.io", 1, profileIs("1g.10gb"))}, gpu},
		{"mig-3g.40gb", []resourceapi.DeviceRequest{allocate.Request("dev", "mig.gpu.hwdra.io", 1, profileIs("3g.40gb"))}, gpu},
		{"gpu-share", []resourceapi.DeviceRequest{capacityRequest("dev", "share.gpu.hwdra.io",
			map[string]string{"gpu.hwdra.io/memory": "20Gi", "gpu.hwdra.io/compute": "40"})}, gpu},
		{"vgpu", []resourceapi.DeviceRequest{allocate.Request("dev", "vgpu.gpu.hwdra.io", 1, profileIs("H100-4C"))}, gpu},
		{"vf-share", []resourceapi.DeviceRequest{capacityRequest("dev", "vf-share.sriov.hwdra.io",
			map[string]string{"sriov.hwdra.io/bandwidth": "10G"})}, vf},
		{"extended", nil, nil},
	}
}()

// badClaims are claims no node satisfies: one more than a DGX H100 holds.
var badClaims = map[string][]resourceapi.DeviceRequest{
	"25x2g.20gb":    {allocate.Request("dev", "mig.gpu.hwdra.io", 25, profileIs("2g.20gb"))},
	"17x3g.40gb":    {allocate.Request("dev", "mig.gpu.hwdra.io", 17, profileIs("3g.40gb"))},
	"15xH100-1-10C": {allocate.Request("dev", "vgpu.gpu.hwdra.io", 15, profileIs("H100-1-10C"))},
}

// createPriorityClasses makes the scheduler take the kinds in turn: its
// queue orders by priority first, then by when a pod entered it, which
// for pods gated on their claims (DRA's PreEnqueue) is when the claim
// reached the scheduler, not creation order. Kind k gets fleet-k<k>, the
// bad pod fleet-bad above all; none preempts (a bad pod would try to).
func createPriorityClasses(ctx context.Context, cs kubernetes.Interface) error {
	never := corev1.PreemptNever
	for name, value := range map[string]int32{"fleet-bad": 2000} {
		if err := createPriorityClass(ctx, cs, name, value, &never); err != nil {
			return err
		}
	}
	for k := range fleetKinds {
		if err := createPriorityClass(ctx, cs, kindPriority(k), int32(1000-k), &never); err != nil {
			return err
		}
	}
	return nil
}

func kindPriority(k int) string { return fmt.Sprintf("fleet-k%d", k) }

// kindGate holds a kind's pods until the kinds before it are bound: the
// scheduler then works on one kind at a time, and the CPU between a
// kind's ungating and its last bind is that kind's alone. (Priorities
// alone order the queue but not the binds: with a fast scheduler the
// next kind's pods were scheduled before the last binds of the one
// before were seen, and the kinds' windows overlapped.)
func kindGate(k int) string { return fmt.Sprintf("hwdra.io/fleet-k%d", k) }

// ungate lets the scheduler at pods held by createPod's gate.
func ungate(ctx context.Context, cs kubernetes.Interface, ns string, pods []string) error {
	patch := []byte(`{"spec":{"schedulingGates":null}}`)
	return parallel(len(pods), func(i int) error {
		_, err := cs.CoreV1().Pods(ns).Patch(ctx, pods[i], types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
}

func createPriorityClass(ctx context.Context, cs kubernetes.Interface, name string, value int32, policy *corev1.PreemptionPolicy) error {
	_, err := cs.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value, PreemptionPolicy: policy,
	}, metav1.CreateOptions{})
	return err
}

// createPod creates a pod that asks for reqs through its own claim, or
// for one nvidia.com/gpu where reqs is nil; held behind a scheduling gate
// of that name, if any (ungate removes it).
func createPod(ctx context.Context, cs kubernetes.Interface, ns, name, priorityClass, gate string, reqs []resourceapi.DeviceRequest) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			PriorityClassName: priorityClass,
			Containers:        []corev1.Container{{Name: "c", Image: "registry.local/pause:v1"}},
		},
	}
	if gate != "" {
		pod.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: gate}}
	}
	if reqs == nil {
		pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	} else {
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}},
		}
		if _, err := cs.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("claim %s: %w", name, err)
		}
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "c", ResourceClaimName: &name}}
		pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "c"}}
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("pod %s: %w", name, err)
	}
	return nil
}

// jsonSize is an object's size as JSON, roughly what etcd stores.
func jsonSize(v any) int {
	b, _ := json.Marshal(v)
	return len(b)
}
