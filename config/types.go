package config

import "github.com/hwdra/hwdra/hw"

// Version and kind of the file format.
const (
	APIVersion = "config.hwdra.io/v1alpha1"
	Kind       = "AgentConfig"
)

// AgentConfig is the decoded file. Build it with Load, Parse or Default:
// they validate it and prepare Resolve.
type AgentConfig struct {
	APIVersion string    `json:"apiVersion"`
	Kind       string    `json:"kind"`
	NICs       []NICRule `json:"nics,omitempty"`
	// Health tunes device health reporting (see HealthConfig).
	Health *HealthConfig `json:"health,omitempty"`

	rules  []rule // validated NICs, or the built-in rule
	health HealthPolicy
}

// NICRule chooses mode and policy for the PFs its selector matches.
type NICRule struct {
	Select    PFSelector `json:"select,omitempty"`
	Mode      Mode       `json:"mode,omitempty"`
	Bandwidth *Bandwidth `json:"bandwidth,omitempty"`
}

// PFSelector matches PFs. Every non-empty list must contain the PF's value;
// an empty selector matches every PF.
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
	// bandwidth share and one VF.
	ModeShared Mode = "shared"
	// ModeExclusive: one device per VF, each claimed whole.
	ModeExclusive Mode = "exclusive"
	// ModeDisabled: not offered.
	ModeDisabled Mode = "disabled"
)

// Bandwidth is the shared-mode request policy as written in the file:
// quantities in bits per second.
type Bandwidth struct {
	Default string `json:"default,omitempty"`
	Minimum string `json:"minimum,omitempty"`
	Step    string `json:"step,omitempty"`
}

// BandwidthPolicy is a validated policy in Mb/s, the VF rate limit's unit.
// Valid shares are Minimum + k*Step; Default is one of them.
type BandwidthPolicy struct {
	DefaultMbps int `json:"defaultMbps"`
	MinimumMbps int `json:"minimumMbps"`
	StepMbps    int `json:"stepMbps"`
}

// Built-in policy: a claim that names no bandwidth gets 10 Gb/s; shares go
// in whole Gb/s from 1 Gb/s.
const (
	DefaultShareMbps   = 10000
	DefaultMinimumMbps = 1000
	DefaultStepMbps    = 1000
)

// DefaultBandwidth is the built-in policy.
var DefaultBandwidth = BandwidthPolicy{DefaultMbps: DefaultShareMbps, MinimumMbps: DefaultMinimumMbps, StepMbps: DefaultStepMbps}

// NICOffer is a PF the agent offers: how, and under which policy.
type NICOffer struct {
	PF   hw.PF `json:"pf"`
	Mode Mode  `json:"mode"`
	// Bandwidth applies in shared mode.
	Bandwidth BandwidthPolicy `json:"bandwidth"`
	// Rule is the index of the deciding nics[] entry, -1 for the built-in
	// default (no configuration file).
	Rule int `json:"rule"`
}

// Skip is a PF left out, and why, for the agent and CLI to log.
type Skip struct {
	PCIAddress string `json:"pciAddress"`
	Netdev     string `json:"netdev,omitempty"`
	Reason     string `json:"reason"`
}

func (s Skip) String() string {
	if s.Netdev == "" {
		return s.PCIAddress + ": " + s.Reason
	}
	return s.PCIAddress + " (" + s.Netdev + "): " + s.Reason
}

// SkipPF makes a Skip for pf.
func SkipPF(pf hw.PF, reason string) Skip {
	return Skip{PCIAddress: pf.PCIAddress, Netdev: pf.Netdev, Reason: reason}
}
