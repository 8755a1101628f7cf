// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"strconv"
	"strings"

	configv1alpha1 "github.com/hwdra/hwdra/api/config/v1alpha1"
	"github.com/hwdra/hwdra/internal/hw"
)

// VFPolicy is what claims may set on the VFs of one PF beyond what their
// DeviceClass sets (the file's vfPolicy, resolved for the PF). The zero
// policy allows nothing: no VLAN but the class's, trust off, spoof
// checking on, no MAC address or GUID.
type VFPolicy struct {
	// Where is the part of the file that decided ("vfPolicy.pfs[1]",
	// "vfPolicy"), "" without a vfPolicy.
	Where string
	// VLANs are the allowed VLAN ranges, inclusive.
	VLANs [][2]int
	// Trust, SpoofCheckOff, MAC and GUIDs: a claim may set trust: true,
	// spoofCheck: false, mac, nodeGUID and portGUID.
	Trust, SpoofCheckOff, MAC, GUIDs bool
}

// The settings of a VFPolicy as the file names them, for messages.
const (
	SettingAllowedVLANs       = "allowedVLANs"
	SettingAllowTrust         = "allowTrust"
	SettingAllowSpoofCheckOff = "allowSpoofCheckOff"
	SettingAllowMAC           = "allowMAC"
	SettingAllowGUIDs         = "allowGUIDs"
)

// AllowsVLAN reports whether a claim may put its VF on VLAN v (0:
// untagged).
func (p VFPolicy) AllowsVLAN(v int) bool {
	for _, r := range p.VLANs {
		if v >= r[0] && v <= r[1] {
			return true
		}
	}
	return false
}

// Setting names a setting of this policy as the file has it
// ("vfPolicy.pfs[0].allowTrust"; "vfPolicy.allowTrust" without a
// vfPolicy, whose settings are all off).
func (p VFPolicy) Setting(name string) string {
	if p.Where == "" {
		return "vfPolicy." + name
	}
	return p.Where + "." + name
}

// VLANList is the allowed VLANs as the file writes them ("100, 200-299"),
// "none" when empty.
func (p VFPolicy) VLANList() string {
	if len(p.VLANs) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(p.VLANs))
	for _, r := range p.VLANs {
		if r[0] == r[1] {
			parts = append(parts, strconv.Itoa(r[0]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", r[0], r[1]))
		}
	}
	return strings.Join(parts, ", ")
}

// VFPolicy resolves the policy of a PF: the first vfPolicy.pfs entry that
// selects it, else vfPolicy's own settings, else the zero policy.
func (c *AgentConfig) VFPolicy(pf hw.PF) VFPolicy {
	for _, r := range c.vfRules {
		if matches(r.sel, pf) {
			return r.policy
		}
	}
	return c.vfDefault
}

// vfRule is a validated vfPolicy.pfs entry.
type vfRule struct {
	sel    configv1alpha1.PFSelector
	policy VFPolicy
}

// compileVFPolicy turns a validated vfPolicy into the policy of the PFs
// no entry selects and the entries.
func compileVFPolicy(v *configv1alpha1.VFPolicy) (VFPolicy, []vfRule) {
	if v == nil {
		return VFPolicy{}, nil
	}
	var rules []vfRule
	for i, r := range v.PFs {
		rules = append(rules, vfRule{sel: r.Select, policy: vfSettings(fmt.Sprintf("vfPolicy.pfs[%d]", i), r.VFClaimSettings)})
	}
	return vfSettings("vfPolicy", v.VFClaimSettings), rules
}

func vfSettings(where string, s configv1alpha1.VFClaimSettings) VFPolicy {
	p := VFPolicy{Where: where, Trust: s.AllowTrust, SpoofCheckOff: s.AllowSpoofCheckOff, MAC: s.AllowMAC, GUIDs: s.AllowGUIDs}
	for _, r := range s.AllowedVLANs {
		lo, hi, err := r.Bounds()
		if err != nil {
			panic(fmt.Sprintf("config: %s.allowedVLANs %q passed validation: %v", where, r, err))
		}
		p.VLANs = append(p.VLANs, [2]int{lo, hi})
	}
	return p
}

// AllowsUnsafeNoIOMMU reports whether the agent may hand out VFIO groups
// of a kernel that runs VFIO without an IOMMU (vfio.allowUnsafeNoIOMMU).
func (c *AgentConfig) AllowsUnsafeNoIOMMU() bool { return c.noIOMMU }
