package hw

// Inventory is everything one probe of a node found.
type Inventory struct {
	// GPUs are sorted by PCI bus ID.
	GPUs []GPU `json:"gpus,omitempty"`
	// PFs are the SR-IOV physical functions, sorted by PCI address.
	PFs []PF `json:"pfs,omitempty"`
}

// UnknownNUMANode is the NUMANode of a device whose NUMA affinity the kernel
// does not report (single-socket machines report -1 too).
const UnknownNUMANode = -1
