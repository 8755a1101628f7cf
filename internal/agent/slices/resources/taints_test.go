// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"reflect"
	"testing"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/slices/device"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// TestGPUTaintsFromFaults: a GPU's fault taints every device of that GPU
// (whole GPU, every MIG placement, every vGPU) and nothing on the other
// GPUs; a partition's fault taints only the devices at its placement.
func TestGPUTaintsFromFaults(t *testing.T) {
	sick, well, vgpu := h100("0000:1b:00.0", 0), h100("0000:43:00.0", 0), h100VGPU("0000:52:00.0")
	part := hw.Placement{Start: 4, Size: 4} // a 3g.40gb GPU instance
	xid := hw.Fault{Reason: "XID79", Message: "XID 79", Fatal: true}
	for _, tc := range []struct {
		name    string
		faults  hw.Health
		tainted func(name string, d GPUDevice) bool
	}{{
		name:    "GPU fault: every device of that GPU",
		faults:  hw.Health{GPUs: map[string]hw.Fault{sick.PCIBusID: xid}},
		tainted: func(_ string, d GPUDevice) bool { return d.GPU.PCIBusID == sick.PCIBusID },
	}, {
		name:   "partition fault: only that placement, MIG-backed vGPUs included",
		faults: hw.Health{Partitions: map[hw.PartitionRef]hw.Fault{{GPU: sick.PCIBusID, Placement: part}: xid, {GPU: vgpu.PCIBusID, Placement: part}: xid}},
		tainted: func(_ string, d GPUDevice) bool {
			return (d.GPU.PCIBusID == sick.PCIBusID || d.GPU.PCIBusID == vgpu.PCIBusID) && d.Kind != device.KindGPU && d.Placement == part
		},
	}, {
		name:    "vGPU host's fault: time-sliced and MIG-backed vGPUs",
		faults:  hw.Health{GPUs: map[string]hw.Fault{vgpu.PCIBusID: xid}},
		tainted: func(_ string, d GPUDevice) bool { return d.GPU.PCIBusID == vgpu.PCIBusID },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			gpus := []hw.GPU{sick, well, vgpu}
			res := TaintedGPU(testNode, gpus, nil, device.AllFeatures, Health{Faults: tc.faults}, config.GPUPolicy{})
			catalog := GPUDevices(gpus, nil, device.AllFeatures)
			n := 0
			for name, d := range devicesByName(res) {
				want := tc.tainted(name, catalog[name])
				if want {
					n++
				}
				if got := len(d.Taints) == 1; got != want {
					t.Errorf("%s: tainted %v, want %v (%v)", name, got, want, d.Taints)
					continue
				}
				if want && !reflect.DeepEqual(d.Taints[0], resourceapi.DeviceTaint{Key: device.GPUTaintKey, Value: "XID79", Effect: resourceapi.DeviceTaintEffectNoSchedule}) {
					t.Errorf("%s: taint %v", name, d.Taints[0])
				}
				if f, ok := catalog[name].Fault(tc.faults); ok != want || ok && f != xid {
					t.Errorf("%s: catalog fault %v %v, the slices say tainted %v", name, f, ok, want)
				}
			}
			if n == 0 {
				t.Fatal("the case taints nothing")
			}
		})
	}
}

// TestAllocatorHonoursTaints: the scheduler's allocator (DeviceTaints on)
// refuses a tainted device to a claim without a toleration, and gives it
// to a claim that tolerates the taint.
func TestAllocatorHonoursTaints(t *testing.T) {
	sick, well := h100("0000:1b:00.0", 0), h100("0000:43:00.0", 0)
	faults := hw.Health{GPUs: map[string]hw.Fault{sick.PCIBusID: {Reason: "XID79", Fatal: true}}}
	res := TaintedGPU(testNode, []hw.GPU{sick, well}, nil, device.AllFeatures, Health{Faults: faults, FatalNoExecute: true}, config.GPUPolicy{})
	a := newAllocator(t, allocate.ClusterFeatures, map[string]resourceslice.DriverResources{device.GPUDriver: res})

	first := claim(profile("gpu", device.ProfileFull, 1))
	if !fits(t, a, first) || allocatedDevices(first)[0] != device.GPUName(well.PCIBusID) {
		t.Fatalf("first whole GPU: %v, want the healthy one", first.Status.Allocation)
	}
	if fits(t, a, claim(profile("gpu", device.ProfileFull, 1))) {
		t.Fatal("the tainted GPU was allocated to a claim without a toleration")
	}
	if fits(t, a, claim(profile("mig", "1g.10gb", 1))) {
		t.Fatal("a partition of the tainted GPU was allocated without a toleration")
	}
	tolerating := claim(profile("gpu", device.ProfileFull, 1))
	tolerating.Spec.Devices.Requests[0].Exactly.Tolerations = []resourceapi.DeviceToleration{{
		Key: device.GPUTaintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoExecute,
	}}
	if !fits(t, a, tolerating) || allocatedDevices(tolerating)[0] != device.GPUName(sick.PCIBusID) {
		t.Fatalf("tolerating claim: %v, want the tainted GPU", tolerating.Status.Allocation)
	}
}

// A down MPS daemon faults exactly the devices that run under it: a GPU's
// shares (not the whole GPU beside them), a claim's whole GPU or MIG
// partition.
func TestGPUDeviceMPSFault(t *testing.T) {
	g := hw.GPU{PCIBusID: "0000:1b:00.0"}
	at := hw.Placement{Start: 4, Size: 2}
	down := hw.Fault{Reason: "MPSDaemonDown"}
	for _, tc := range []struct {
		name   string
		dev    GPUDevice
		faults map[hw.MPSRef]hw.Fault
		want   bool
	}{
		{"share, its daemon down", GPUDevice{Kind: device.KindShare, GPU: g}, map[hw.MPSRef]hw.Fault{{PartitionRef: hw.PartitionRef{GPU: g.PCIBusID}, Shares: true}: down}, true},
		{"whole GPU beside its shares' daemon", GPUDevice{Kind: device.KindGPU, GPU: g}, map[hw.MPSRef]hw.Fault{{PartitionRef: hw.PartitionRef{GPU: g.PCIBusID}, Shares: true}: down}, false},
		{"whole GPU, its claim's daemon down", GPUDevice{Kind: device.KindGPU, GPU: g}, map[hw.MPSRef]hw.Fault{{PartitionRef: hw.PartitionRef{GPU: g.PCIBusID}}: down}, true},
		{"MIG partition, its daemon down", GPUDevice{Kind: device.KindMIG, GPU: g, Placement: at}, map[hw.MPSRef]hw.Fault{{PartitionRef: hw.PartitionRef{GPU: g.PCIBusID, Placement: at}}: down}, true},
		{"another partition's daemon", GPUDevice{Kind: device.KindMIG, GPU: g, Placement: hw.Placement{Start: 0, Size: 2}}, map[hw.MPSRef]hw.Fault{{PartitionRef: hw.PartitionRef{GPU: g.PCIBusID, Placement: at}}: down}, false},
	} {
		if _, got := tc.dev.Fault(hw.Health{MPS: tc.faults}); got != tc.want {
			t.Errorf("%s: faulted %v, want %v", tc.name, got, tc.want)
		}
	}
}
