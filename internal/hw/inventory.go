// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package hw

// Inventory is everything one probe of a node found.
type Inventory struct {
	// GPUs are sorted by PCI bus ID.
	GPUs []GPU `json:"gpus,omitempty"`
	// UnreadableGPUs are on the bus but did not answer this probe (lost,
	// or a query failed). They are not in GPUs; the agent keeps publishing
	// what they last reported, tainted.
	UnreadableGPUs []UnreadableGPU `json:"unreadableGPUs,omitempty"`
	// PassthroughGPUs are NVIDIA GPUs bound to vfio-pci, sorted by PCI
	// address: NVML does not see them; they are offered whole to VMs.
	PassthroughGPUs []PassthroughGPU `json:"passthroughGPUs,omitempty"`
	// PFs are the SR-IOV physical functions, sorted by PCI address.
	PFs []PF `json:"pfs,omitempty"`
}

// UnreadableGPU is a GPU a probe could not read.
type UnreadableGPU struct {
	// Index is NVML's index; PCIBusID is empty when even that was
	// unreadable (a lost GPU answers nothing).
	Index    int    `json:"index"`
	PCIBusID string `json:"pciBusID,omitempty"`
	// Lost: NVML says the GPU fell off the bus (ERROR_GPU_IS_LOST).
	Lost  bool   `json:"lost,omitempty"`
	Error string `json:"error"`
}

// UnknownNUMANode is the NUMANode of a device whose NUMA affinity the kernel
// does not report (single-socket machines report -1 too).
const UnknownNUMANode = -1
