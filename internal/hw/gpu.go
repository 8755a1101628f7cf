// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package hw

// GPU is one physical NVIDIA GPU.
type GPU struct {
	UUID        string `json:"uuid"`
	ProductName string `json:"productName"`
	// PCIBusID is the canonical, lower-case PCI address ("0000:3b:00.0").
	// Device names derive from it because it survives reboots and driver
	// reloads, unlike the minor number or the NVML index.
	PCIBusID string `json:"pciBusID"`
	// PCIDeviceID is NVML's combined device and vendor ID (0x233010DE).
	PCIDeviceID uint32 `json:"pciDeviceID"`
	Index       int    `json:"index"`
	Minor       int    `json:"minor"`
	MemoryBytes uint64 `json:"memoryBytes"`
	// Architecture is lower case: "ampere", "hopper", "blackwell", ...
	Architecture          string `json:"architecture"`
	CUDAComputeCapability string `json:"cudaComputeCapability"`
	DriverVersion         string `json:"driverVersion"`
	CUDADriverVersion     string `json:"cudaDriverVersion"`
	NUMANode              int    `json:"numaNode"`
	// PCIeRoot is the PCIe root complex the GPU hangs off ("pci0000:00"),
	// empty when unknown.
	PCIeRoot string `json:"pcieRoot,omitempty"`

	MIG            MIG            `json:"mig"`
	Virtualization Virtualization `json:"virtualization"`
	VGPU           VGPU           `json:"vgpu,omitzero"`
}

// MIG describes a GPU's multi-instance GPU support and state.
type MIG struct {
	Capable bool `json:"capable"`
	// Enabled is the current MIG mode; Pending the mode after the next reset.
	Enabled bool `json:"enabled"`
	Pending bool `json:"pending"`
	// SwitchWithoutReset: the mode can change without a GPU reset (Hopper and
	// later), so the agent may switch it when nothing runs on the GPU.
	SwitchWithoutReset bool `json:"switchWithoutReset,omitempty"`
	// MemorySlices is the number of memory slices that placements index.
	MemorySlices int          `json:"memorySlices,omitempty"`
	Profiles     []MIGProfile `json:"profiles,omitempty"`
	// Instances are the GPU instances that exist now.
	Instances []GPUInstance `json:"instances,omitempty"`
}

// MIGProfile is one GPU-instance profile as NVML reports it.
type MIGProfile struct {
	// ID is NVML's GPU instance profile ID (GPU_INSTANCE_PROFILE_*).
	ID int `json:"id"`
	// Name is the canonical profile name: "1g.10gb", "1g.10gb+me", "4g.40gb".
	Name            string `json:"name"`
	Slices          int    `json:"slices"`
	InstanceCount   int    `json:"instanceCount"`
	Multiprocessors int    `json:"multiprocessors"`
	CopyEngines     int    `json:"copyEngines"`
	Decoders        int    `json:"decoders"`
	Encoders        int    `json:"encoders"`
	JPEGEngines     int    `json:"jpegEngines"`
	OFAEngines      int    `json:"ofaEngines"`
	MemoryBytes     uint64 `json:"memoryBytes"`
	// Placements are the memory-slice ranges an instance of this profile
	// may occupy.
	Placements      []Placement      `json:"placements,omitempty"`
	ComputeProfiles []ComputeProfile `json:"computeProfiles,omitempty"`
}

// Placement is a range of memory slices: [Start, Start+Size).
type Placement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// Overlaps reports whether two placements share a memory slice.
func (p Placement) Overlaps(o Placement) bool {
	return p.Start < o.Start+o.Size && o.Start < p.Start+p.Size
}

// ComputeProfile is a compute-instance profile inside a GPU instance.
type ComputeProfile struct {
	// ID is NVML's compute instance profile ID (COMPUTE_INSTANCE_PROFILE_*).
	ID              int `json:"id"`
	Slices          int `json:"slices"`
	InstanceCount   int `json:"instanceCount"`
	Multiprocessors int `json:"multiprocessors"`
}

// GPUInstance is an existing MIG GPU instance.
type GPUInstance struct {
	ID               int               `json:"id"`
	ProfileID        int               `json:"profileID"`
	Placement        Placement         `json:"placement"`
	ComputeInstances []ComputeInstance `json:"computeInstances,omitempty"`
}

// ComputeInstance is an existing compute instance of a GPU instance.
type ComputeInstance struct {
	ID        int `json:"id"`
	ProfileID int `json:"profileID"`
	// UUID is the MIG device's UUID ("MIG-..."), empty when unknown.
	UUID string `json:"uuid,omitempty"`
}

// Virtualization is NVML's GPU virtualization mode.
type Virtualization string

const (
	VirtualizationNone        Virtualization = "none"
	VirtualizationPassthrough Virtualization = "passthrough"
	VirtualizationGuestVGPU   Virtualization = "guest-vgpu"
	VirtualizationHostVGPU    Virtualization = "host-vgpu"
	VirtualizationHostVSGA    Virtualization = "host-vsga"
)

// VGPU describes what a GPU in host-vGPU mode can offer.
type VGPU struct {
	// Heterogeneous: time-sliced types of different sizes may run at once.
	// Otherwise every time-sliced vGPU on the GPU must be of one type.
	Heterogeneous bool `json:"heterogeneous,omitempty"`
	// Framework is how the node's driver creates vGPUs on this GPU; empty
	// when neither is set up (no VFs enabled, no mdev types): then no
	// vGPU can be created, whatever NVML lists.
	Framework VGPUFramework `json:"framework,omitempty"`
	// VFs is the number of SR-IOV virtual functions that host vGPUs, one
	// each; 0 where the GPU's own function is the parent (mdev before
	// Ampere) and only the types' maximums limit.
	VFs   int        `json:"vfs,omitempty"`
	Types []VGPUType `json:"types,omitempty"`
}

// VGPUFramework is how a vGPU is created on a GPU.
type VGPUFramework string

const (
	// VGPUFrameworkMdev: mediated devices, created by writing a UUID to
	// mdev_supported_types/nvidia-<type>/create of the GPU or its VF.
	VGPUFrameworkMdev VGPUFramework = "mdev"
	// VGPUFrameworkVFIO: NVIDIA's vendor-specific VFIO framework (R550+
	// on Ada, Hopper and Blackwell with current kernels): each VF becomes
	// a vGPU by a write of the type ID to its nvidia/current_vgpu_type and
	// is handed to the VM as a VFIO PCI device.
	VGPUFrameworkVFIO VGPUFramework = "vfio"
)

// VGPUType is one vGPU type the GPU supports.
type VGPUType struct {
	// ID is NVML's vGPU type ID.
	ID               uint   `json:"id"`
	Name             string `json:"name"`
	Class            string `json:"class"`
	FramebufferBytes uint64 `json:"framebufferBytes"`
	MaxInstances     int    `json:"maxInstances"`
	// GPUInstanceProfileID is set for MIG-backed types: the GPU instance
	// profile each vGPU of this type occupies. Nil for time-sliced types.
	GPUInstanceProfileID *int `json:"gpuInstanceProfileID,omitempty"`
	// Creatable: the GPU's framework offers the type (mdev: it has a type
	// directory; the VFIO framework creates every type the vGPU manager
	// supports). Only creatable types are published.
	Creatable bool `json:"creatable,omitempty"`
}

// Profile returns the MIG profile with the given ID.
func (m *MIG) Profile(id int) (MIGProfile, bool) {
	for _, p := range m.Profiles {
		if p.ID == id {
			return p, true
		}
	}
	return MIGProfile{}, false
}
