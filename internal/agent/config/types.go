// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	configv1alpha1 "github.com/hwdra/hwdra/api/config/v1alpha1"
	"github.com/hwdra/hwdra/internal/hw"
)

// AgentConfig is a loaded configuration: the file's (api/config/v1alpha1),
// validated and compiled for Resolve and HealthPolicy. Build it with Load,
// Parse or Default.
type AgentConfig struct {
	rules        []rule // the file's nics[], or the built-in rule
	health       HealthPolicy
	gpu          GPUPolicy
	devicePlugin devicePlugin
	// vfDefault and vfRules are the vfPolicy: the policy of the PFs no
	// rule selects, then the rules.
	vfDefault VFPolicy
	vfRules   []vfRule
	// noIOMMU is vfio.allowUnsafeNoIOMMU.
	noIOMMU bool
}

// Mode is how a PF is offered, as the file names it.
type Mode = configv1alpha1.Mode

// Modes.
const (
	ModeShared    = configv1alpha1.ModeShared
	ModeExclusive = configv1alpha1.ModeExclusive
	ModeDisabled  = configv1alpha1.ModeDisabled
)

// BandwidthPolicy is a shared PF's request policy in Mb/s, the VF rate
// limit's unit. Valid shares are Minimum + k*Step; Default is one of them.
type BandwidthPolicy struct {
	DefaultMbps int `json:"defaultMbps"`
	MinimumMbps int `json:"minimumMbps"`
	StepMbps    int `json:"stepMbps"`
}

// DefaultBandwidth is the built-in policy.
var DefaultBandwidth = BandwidthPolicy{
	DefaultMbps: configv1alpha1.DefaultShareMbps, MinimumMbps: configv1alpha1.DefaultMinimumMbps, StepMbps: configv1alpha1.DefaultStepMbps,
}

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
