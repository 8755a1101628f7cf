// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

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
	// deliberate act. Left out (or without a file) every PF with VFs is
	// offered in shared mode with the default bandwidth policy, except
	// those. An empty list is refused: [{mode: disabled}] offers none.
	NICs []NICRule `json:"nics,omitempty"`
	// Health tunes device health reporting. Left out: the defaults.
	Health *HealthConfig `json:"health,omitempty"`
	// DevicePlugin says how the agent shares a node with NVIDIA's
	// Kubernetes device plugin. Without it the agent recognises the device
	// plugin by its default resource names and, while it sees it, leaves
	// it every GPU.
	DevicePlugin *DevicePluginConfig `json:"devicePlugin,omitempty"`
	// GPUs tunes what the GPU driver publishes.
	GPUs *GPUConfig `json:"gpus,omitempty"`
	// VFPolicy says what claims may set on the VFs they get. Left out:
	// no VLAN but the DeviceClass's, trust off, spoof checking on, and no
	// MAC address or InfiniBand GUID from claims.
	VFPolicy *VFPolicy `json:"vfPolicy,omitempty"`
	// VFIO says which VFIO groups the agent hands to claims (passthrough
	// GPUs, vGPUs of the vendor-specific VFIO framework, VFs bound to
	// vfio-pci). Left out: only groups an IOMMU isolates.
	VFIO *VFIOConfig `json:"vfio,omitempty"`
}

// VFPolicy is what a claim's VfConfig may set on a VF. What the
// DeviceClass's VfConfig sets is the administrator's and always applies:
// its mac, vlan and vlanQoS, trust, spoofCheck, nodeGUID and portGUID stay
// whatever the claim's VfConfig says of its other fields. A claim may
// change those only as the policy of the VF's PF allows (the first entry
// of pfs whose select matches the PF, else the fields here): a claim that
// asks for more is refused at prepare, naming the field, the PF and the
// setting that forbids it, before any VF is touched. A claim may always
// ask for less (trust false, spoofCheck true) and may repeat its class's
// values.
type VFPolicy struct {
	// The settings of every PF that no entry of pfs selects.
	VFClaimSettings `json:",inline"`
	// PFs are the settings of particular PFs: the first entry whose
	// select matches a PF decides for it, wholly (the fields above do not
	// add to it).
	PFs []VFPolicyRule `json:"pfs,omitempty"`
}

// VFPolicyRule is the policy of the PFs its selector matches.
type VFPolicyRule struct {
	// Select matches PFs as nics[].select does; empty matches every PF.
	Select          PFSelector `json:"select,omitempty"`
	VFClaimSettings `json:",inline"`
}

// VFClaimSettings are what claims may set on a PF's VFs beyond what their
// DeviceClass sets. Each is off (empty) by default.
type VFClaimSettings struct {
	// AllowedVLANs are the VLANs a claim may put its VF on (vlan), with
	// any 802.1p priority (vlanQoS): VLAN IDs (100) or ranges ("200-299"),
	// 1 to 4094; 0 lets a claim take its VF off its class's VLAN
	// (untagged). Default: none but the DeviceClass's.
	AllowedVLANs []VLANRange `json:"allowedVLANs,omitempty"`
	// AllowTrust lets a claim set trust: true: the VF may then change its
	// own MAC address and enter promiscuous mode.
	AllowTrust bool `json:"allowTrust,omitempty"`
	// AllowSpoofCheckOff lets a claim set spoofCheck: false: the VF may
	// then send frames with any source MAC address (another host's, a
	// router's).
	AllowSpoofCheckOff bool `json:"allowSpoofCheckOff,omitempty"`
	// AllowMAC lets a claim choose its VF's MAC address (mac).
	AllowMAC bool `json:"allowMAC,omitempty"`
	// AllowGUIDs lets a claim choose an InfiniBand VF's nodeGUID and
	// portGUID, the identities the subnet manager and partitions go by.
	AllowGUIDs bool `json:"allowGUIDs,omitempty"`
}

// VLANRange is a VLAN ID (100, or "100") or an inclusive range of them
// ("200-299"). Any other JSON value is kept as its text, for validation to
// refuse with the field's path.
type VLANRange string

// UnmarshalJSON takes a string as it is and a number as its digits; null
// leaves the range empty.
func (r *VLANRange) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(data, &s) == nil {
		*r = VLANRange(s)
		return nil
	}
	*r = VLANRange(data)
	return nil
}

// VFIOConfig says which VFIO groups the agent may hand to claims.
type VFIOConfig struct {
	// AllowUnsafeNoIOMMU lets the agent hand out VFIO groups of a kernel
	// that runs VFIO without an IOMMU (the vfio module's
	// enable_unsafe_noiommu_mode: /dev/vfio/noiommu-<N>). Nothing then
	// confines the device's DMA: whoever opens such a group can read and
	// write all of the node's memory through it. Default false: a claim
	// for a device in such a group is refused at prepare.
	AllowUnsafeNoIOMMU bool `json:"allowUnsafeNoIOMMU,omitempty"`
}

// GPUConfig tunes what the GPU driver publishes and which GPU settings it
// may change.
type GPUConfig struct {
	// MIGProfiles chooses the MIG profiles offered where MIG partitions
	// are (GPUs with MIG on, and GPUs with MIG off that switch without a
	// reset). The scheduler goes through every published device for
	// every pending pod on every node, so a profile that no claim asks for
	// costs scheduling time for nothing (docs/design.md, "What the scheduler pays").
	// Default: every profile the GPU reports.
	MIGProfiles *ProfileFilter `json:"migProfiles,omitempty"`
	// Settings says whether the agent may change a GPU's settings for
	// claims: its MIG mode, its compute mode and its time slice.
	// Default: Manage.
	Settings GPUSettings `json:"settings,omitempty"`
	// Shares says how the agent holds GPU shares to what the scheduler
	// counted. Left out: the defaults.
	Shares *GPUSharesConfig `json:"shares,omitempty"`
	// ClaimStatus says whether the agent writes each prepared GPU
	// device's entry in its ResourceClaim's status.devices (a Ready
	// condition and data: UUIDs, MIG IDs, a share's limits, the MPS
	// pipe directory), one API write per prepared claim, after the
	// kubelet has its answer. Off: no such writes, for clusters that
	// want none (VF network status is written either way). Default:
	// Write.
	ClaimStatus GPUClaimStatus `json:"claimStatus,omitempty"`
	// MPS sizes what the agent gives each MPS control daemon (a claim's
	// MPS devices, a GPU's shares). Left out: the defaults.
	MPS *MPSConfig `json:"mps,omitempty"`
}

// MPSConfig sizes each MPS control daemon's resources. Quantities are
// Kubernetes quantities of bytes ("1Gi").
type MPSConfig struct {
	// ShmSize is the size of the daemon's shared memory: a tmpfs of its
	// own that the daemon and every container on it mount at /dev/shm
	// (MPS servers and clients meet there, so all of them share it; the
	// containers' own POSIX shared memory goes there too). A page
	// written there counts against the memory limit of the container
	// that wrote it first. 1Mi to 1Ti. Default: 1Gi.
	ShmSize Quantity `json:"shmSize,omitempty"`
	// DaemonMemoryLimit is the memory limit of the daemon's cgroup,
	// which holds the control daemon and the MPS servers it starts. At
	// least 64Mi. Default: 4Gi.
	DaemonMemoryLimit Quantity `json:"daemonMemoryLimit,omitempty"`
}

// GPUClaimStatus is whether GPU claims get status.devices entries.
type GPUClaimStatus string

const (
	GPUClaimStatusWrite GPUClaimStatus = "Write"
	GPUClaimStatusOff   GPUClaimStatus = "Off"
)

// GPUSharesConfig is the policing of GPU shares: every CheckInterval the
// agent looks at the processes on each GPU that serves shares and acts on
// a share whose processes hold more GPU memory than the share, an MPS
// client that started with limits above its share (or none), a process
// of a share's container outside MPS, and a pod's process that uses no
// claim of the GPU. A process outside Kubernetes is only reported.
type GPUSharesConfig struct {
	// Overuse is what happens to such a process: Stop (SIGKILL, as the
	// kernel's OOM killer does, with a Warning Event on its pod) or Report
	// (the Event alone). Default: Stop.
	Overuse ShareOveruse `json:"overuse,omitempty"`
	// CheckIntervalMilliseconds is how often the processes are looked at:
	// how long a process can overrun before it is caught. 100 to 60000.
	// Default: 1000.
	CheckIntervalMilliseconds *int `json:"checkIntervalMilliseconds,omitempty"`
}

// ShareOveruse is what the agent does to a process that overruns a GPU
// share.
type ShareOveruse string

const (
	ShareOveruseStop   ShareOveruse = "Stop"
	ShareOveruseReport ShareOveruse = "Report"
)

// GPUSettings is who owns a GPU's MIG mode, compute mode and time slice.
type GPUSettings string

const (
	// GPUSettingsManage: the agent changes them as claims need (MIG mode
	// for a MIG partition of a GPU that switches without a reset,
	// ExclusiveProcess under an MPS daemon, Default and the claim's time
	// slice for time-slicing) and restores them when no claim uses the
	// GPU.
	GPUSettingsManage GPUSettings = "Manage"
	// GPUSettingsLeave: the agent never changes them, for nodes where
	// another tool owns them (the GPU operator's MIG manager) or that
	// must keep them. MIG partitions are offered only on GPUs already in
	// MIG mode, time-slicing claims are refused, and MPS daemons and GPU
	// shares run in the compute mode the GPU has. A setting the agent
	// changed before (under Manage) is still restored once no claim uses
	// its GPU.
	GPUSettingsLeave GPUSettings = "Leave"
)

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
	Default Quantity `json:"default,omitempty"`
	// Minimum share. Default: Step, or 1G.
	Minimum Quantity `json:"minimum,omitempty"`
	// Step between shares. Default: Minimum, or 1G.
	Step Quantity `json:"step,omitempty"`
}

// Quantity is a Kubernetes quantity as written: a string ("10G") or, as
// Kubernetes takes quantities, a bare number (bits per second). Any other
// JSON value is kept as its text, for validation to refuse with the
// field's path.
type Quantity string

// UnmarshalJSON takes a string as it is and any other value as its JSON
// text; null leaves the quantity unset.
func (q *Quantity) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(data, &s) == nil {
		*q = Quantity(s)
		return nil
	}
	*q = Quantity(data)
	return nil
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

// DevicePluginConfig: a GPU must never be offered twice, by NVIDIA's
// device plugin (as an extended resource in the node's status) and by the
// agent (in a ResourceSlice), or the scheduler hands it to two pods. The
// agent sees the device plugin by its socket in the kubelet's
// device-plugin directory (the plugin names it nvidia-<name>.sock for the
// resource nvidia.com/<name>) and by the node advertising one of
// Resources in status.capacity or status.allocatable. While it sees
// either, it publishes only the GPUs of OwnedGPUs: none without them.
type DevicePluginConfig struct {
	// Resources are the extended resources that mean the device plugin
	// serves GPUs on the node: names ("nvidia.com/gpu") or prefixes
	// ending in "*" ("nvidia.com/mig-*"). Default: nvidia.com/gpu,
	// nvidia.com/gpu.shared (time-slicing that renames the resource) and
	// nvidia.com/mig-* (the mixed MIG strategy).
	Resources []string `json:"resources,omitempty"`
	// OwnedGPUs split a node between the device plugin and the agent on
	// purpose: the agent publishes exactly these GPUs, whether or not it
	// sees the device plugin, and leaves every other GPU to it (which must
	// be set up to leave these alone). Unset: the agent owns every GPU,
	// and none while it sees the device plugin.
	OwnedGPUs *GPUSelector `json:"ownedGPUs,omitempty"`
}

// GPUSelector selects GPUs: a GPU is selected when either list holds it.
type GPUSelector struct {
	// PCIAddresses: "0000:1b:00.0" (or "1b:00.0", domain 0000).
	PCIAddresses []string `json:"pciAddresses,omitempty"`
	// UUIDs as NVML reports them: "GPU-" and 32 hex digits in 8-4-4-4-12
	// groups ("GPU-3ae1f2c4-...").
	UUIDs []string `json:"uuids,omitempty"`
}

// DefaultDevicePluginResources are the resources NVIDIA's device plugin
// advertises GPUs as, in its default configurations.
var DefaultDevicePluginResources = []string{"nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*"}
