package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// AgentConfig is the agent's configuration file.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type AgentConfig struct {
	metav1.TypeMeta `json:",inline"`
	// NICs choose, in order, how each PF is offered: the first entry whose
	// select matches a PF decides for it; a PF no entry selects is not
	// offered. A PF that carries one of the node's default routes is only
	// offered by an entry that names it (select.names or
	// select.pciAddresses): handing the management link to pods must be a
	// deliberate act. Without a file every PF with VFs is offered in shared
	// mode with the default bandwidth policy, except those.
	NICs []NICRule `json:"nics,omitempty"`
	// Health tunes device health reporting.
	Health *HealthConfig `json:"health,omitempty"`
	// GPUs tunes what the GPU driver publishes.
	GPUs *GPUConfig `json:"gpus,omitempty"`
}

// GPUConfig tunes what the GPU driver publishes.
type GPUConfig struct {
	// MIGProfiles chooses the MIG profiles offered where MIG partitions
	// are (GPUs with MIG on, and GPUs with MIG off that switch without a
	// reset). The scheduler goes through every published device for
	// every pending pod on every node, so a profile that no claim asks for
	// costs scheduling time for nothing (README, "Scheduler cost").
	// Default: every profile the GPU reports.
	MIGProfiles *ProfileFilter `json:"migProfiles,omitempty"`
}

// ProfileFilter selects profiles by NVIDIA's names ("1g.10gb",
// "1g.10gb+me") or by shell patterns ("*+me*", "1g.*"; * and ? match any
// characters, as path.Match does). A profile is offered when include is
// empty or one of its patterns matches, and none of exclude's does.
type ProfileFilter struct {
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
}

// NICRule chooses mode and policy for the PFs its selector matches.
type NICRule struct {
	// Select matches PFs; empty matches every PF.
	Select PFSelector `json:"select,omitempty"`
	// Mode is how the PFs are offered. Default: shared.
	Mode Mode `json:"mode,omitempty"`
	// Bandwidth is the request policy of a shared PF's bandwidth
	// capacity (shared mode only).
	Bandwidth *Bandwidth `json:"bandwidth,omitempty"`
}

// PFSelector matches PFs. Every non-empty list must contain the PF's value.
type PFSelector struct {
	// Names are PF netdev names.
	Names []string `json:"names,omitempty"`
	// PCIAddresses: "0000:17:00.0" (or "17:00.0", domain 0000).
	PCIAddresses []string `json:"pciAddresses,omitempty"`
	// VendorIDs and DeviceIDs: four hex digits, quoted ("15b3", "1021").
	VendorIDs []string `json:"vendorIDs,omitempty"`
	DeviceIDs []string `json:"deviceIDs,omitempty"`
	// Drivers: the PF's kernel driver ("mlx5_core", "ice").
	Drivers []string `json:"drivers,omitempty"`
}

// Mode is how a PF is offered.
type Mode string

const (
	// ModeShared: one device per PF, shared by claims that each consume a
	// bandwidth share and one VF. It publishes the capacities
	// "sriov.hwdra.io/bandwidth" (the link speed, with the rule's request
	// policy) and "sriov.hwdra.io/vfs" (the VF count; each share takes
	// one).
	ModeShared Mode = "shared"
	// ModeExclusive: one device per VF, each claimed whole.
	ModeExclusive Mode = "exclusive"
	// ModeDisabled: not offered.
	ModeDisabled Mode = "disabled"
)

// Bandwidth is a shared PF's request policy: Kubernetes quantities in bits
// per second with decimal suffixes ("10G" is 10 Gb/s, "500M" 500 Mb/s),
// each a whole number of Mb/s: Mb/s is the unit of the kernel's VF rate
// limit, which enforces the share at prepare, so the scheduler counts
// exactly what the wire gets. Valid shares are Minimum plus a multiple of
// Step.
type Bandwidth struct {
	// Default is what a claim that names no bandwidth gets. Default: 10G,
	// rounded up to a valid share.
	Default string `json:"default,omitempty"`
	// Minimum share. Default: Step, or 1G.
	Minimum string `json:"minimum,omitempty"`
	// Step between shares. Default: Minimum, or 1G.
	Step string `json:"step,omitempty"`
}

// HealthConfig tunes device health reporting. A GPU XID is a device
// failure unless it is an application XID (the built-in 13, 31, 43, 45,
// 68, 109, plus xids.ignore, minus xids.report); where the driver reports
// NVML's GPU recovery action, a failure XID still needs the driver to ask
// for a recovery action.
type HealthConfig struct {
	// XIDs moves GPU XIDs in and out of the application XIDs, the ones
	// that are the running program's fault and not the device's.
	XIDs XIDConfig `json:"xids,omitempty"`
	// FatalEffect is the taint effect of fatal faults (a GPU lost, a reset
	// needed, uncorrectable memory errors): NoSchedule (default) keeps new
	// claims off the device, NoExecute also makes Kubernetes evict the
	// pods that use it. Other faults always taint NoSchedule.
	FatalEffect string `json:"fatalEffect,omitempty"`
}

// XIDConfig adds to and removes from the built-in application XIDs.
type XIDConfig struct {
	// Ignore: XIDs that are no device failure on this node either.
	Ignore []uint64 `json:"ignore,omitempty"`
	// Report: XIDs that count as device failures even where they are
	// application XIDs by default.
	Report []uint64 `json:"report,omitempty"`
}

// Taint effects of fatal faults.
const (
	EffectNoSchedule = "NoSchedule"
	EffectNoExecute  = "NoExecute"
)
