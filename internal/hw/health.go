// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package hw

import "fmt"

// Fault is something wrong with a piece of hardware, as the health monitors
// found it. Every device on that hardware is reported unhealthy to the
// kubelet and tainted in the slices.
type Fault struct {
	// Reason is short, a label value ("XID79", "GPULost", "LinkDown"): the
	// taint's value.
	Reason string `json:"reason"`
	// Message says what happened and where, for people.
	Message string `json:"message"`
	// Fatal: work on the device cannot go on (a GPU lost from the bus,
	// uncorrectable memory errors, a reset needed). The agent may taint
	// such devices NoExecute.
	Fatal bool `json:"fatal,omitempty"`
}

// Health is what is known to be wrong on a node, by the hardware it
// concerns. The zero value: nothing.
type Health struct {
	// GPUs by PCI address: every device on the GPU.
	GPUs map[string]Fault
	// Partitions: one MIG GPU instance, by the GPU's PCI address and the
	// instance's placement: the devices at exactly that placement.
	Partitions map[PartitionRef]Fault
	// PFs by PCI address: every device of the PF (its shared device, its
	// VFs).
	PFs map[string]Fault
	// VFs by PCI address.
	VFs map[string]Fault
	// MPS: an MPS control daemon is down, by what it serves: the devices
	// that run under it.
	MPS map[MPSRef]Fault
}

// MPSRef names what an MPS control daemon serves: a GPU's shares (the
// daemon of its policed shares or of one dedicated share: both serve the
// GPU's one share device), or one GPU or MIG partition (by placement;
// none for a whole GPU) of a claim shared through MPS.
type MPSRef struct {
	PartitionRef
	Shares bool
}

// PartitionRef names a MIG partition of a GPU by where it sits.
type PartitionRef struct {
	GPU       string
	Placement Placement
}

// GPUFault is the fault of a device on GPU busID. at is the device's
// placement (a MIG partition, a MIG-backed vGPU), nil for devices that span
// the GPU (the whole GPU, time-sliced vGPUs). The GPU's own fault wins: a
// parent's failure is its partitions' failure.
func (h Health) GPUFault(busID string, at *Placement) (Fault, bool) {
	if f, ok := h.GPUs[busID]; ok {
		return f, true
	}
	if at == nil {
		return Fault{}, false
	}
	f, ok := h.Partitions[PartitionRef{GPU: busID, Placement: *at}]
	return f, ok
}

// NICFault is the fault of a device of a PF (PCI address pf); vf is a VF
// device's PCI address, "" for the PF's shared device. The PF's own fault
// wins.
func (h Health) NICFault(pf, vf string) (Fault, bool) {
	if f, ok := h.PFs[pf]; ok {
		return f, true
	}
	if vf == "" {
		return Fault{}, false
	}
	f, ok := h.VFs[vf]
	return f, ok
}

// Empty reports whether nothing is wrong.
func (h Health) Empty() bool {
	return len(h.GPUs) == 0 && len(h.Partitions) == 0 && len(h.PFs) == 0 && len(h.VFs) == 0 && len(h.MPS) == 0
}

// LinkFault is the fault of a PF's link as the PF reports it: down, or up
// at a speed nobody can tell (bandwidth shares need it). The slices and the
// NIC health monitor both judge a link by this.
func (pf PF) LinkFault() (Fault, bool) {
	name := pf.PCIAddress
	if pf.Netdev != "" {
		name += " (" + pf.Netdev + ")"
	}
	switch {
	case !pf.LinkUp:
		return Fault{Reason: "LinkDown", Message: fmt.Sprintf("PF %s: link is down (no carrier)", name)}, true
	case pf.SpeedMbps <= 0:
		return Fault{Reason: "SpeedUnknown", Message: fmt.Sprintf("PF %s: link is up but its speed is unknown", name)}, true
	}
	return Fault{}, false
}
