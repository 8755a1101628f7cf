// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwdra/hwdra/internal/hw"
)

// Health is what the builders taint: the node's faults, and how.
type Health struct {
	Faults hw.Health
	// FatalNoExecute: fatal faults taint NoExecute (Kubernetes evicts the
	// pods using the device), others NoSchedule (no new claim lands).
	FatalNoExecute bool
}

func (h Health) taint(key string, f hw.Fault) resourceapi.DeviceTaint {
	effect := resourceapi.DeviceTaintEffectNoSchedule
	if f.Fatal && h.FatalNoExecute {
		effect = resourceapi.DeviceTaintEffectNoExecute
	}
	// TimeAdded stays unset: the API server sets it, and the slice
	// controller keeps it while key, value and effect stay the same.
	return resourceapi.DeviceTaint{Key: key, Value: f.Reason, Effect: effect}
}

// At is the placement a GPU device occupies: a MIG partition's or a
// MIG-backed vGPU's; nil for devices that span the GPU.
func (d GPUDevice) At() *hw.Placement {
	if d.Kind == device.KindGPU || d.Placement.Size == 0 {
		return nil
	}
	pl := d.Placement
	return &pl
}

// Fault is the device's fault in h, if any: its GPU's, or its
// partition's, or that of the MPS daemon it runs under.
func (d GPUDevice) Fault(h hw.Health) (hw.Fault, bool) {
	if f, ok := h.GPUFault(d.PCIBusID(), d.At()); ok {
		return f, true
	}
	if d.Kind == device.KindVGPU || d.Kind == device.KindPassthrough {
		return hw.Fault{}, false
	}
	ref := hw.MPSRef{PartitionRef: hw.PartitionRef{GPU: d.GPU.PCIBusID}, Shares: d.Kind == device.KindShare}
	if at := d.At(); at != nil {
		ref.Placement = *at
	}
	f, ok := h.MPS[ref]
	return f, ok
}

// Fault is the device's fault in h, if any: its PF's or VF's as the
// monitors found them, else its PF's link as the inventory shows it.
func (d NICDevice) Fault(h hw.Health) (hw.Fault, bool) {
	vf := ""
	if d.VF != nil {
		vf = d.VF.PCIAddress
	}
	if f, ok := h.NICFault(d.PF.PCIAddress, vf); ok {
		return f, true
	}
	return d.PF.LinkFault()
}
