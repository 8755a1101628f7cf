// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"slices"

	configv1alpha1 "github.com/hwdra/hwdra/api/config/v1alpha1"
	"github.com/hwdra/hwdra/internal/hw"
)

// Resolve decides for each PF whether it is offered, how and under which
// policy. Pure: the same PFs and configuration give the same answer. Link
// state and speed are not judged here but where devices are built
// (resources.NIC in slices/resources), which skips what it cannot publish.
func (c *AgentConfig) Resolve(pfs []hw.PF) ([]NICOffer, []Skip) {
	var (
		offers []NICOffer
		skips  []Skip
	)
	for _, pf := range pfs {
		r, reason := c.match(pf)
		switch {
		case r == nil:
			skips = append(skips, SkipPF(pf, reason))
		case r.mode == ModeDisabled:
			skips = append(skips, SkipPF(pf, fmt.Sprintf("mode disabled by nics[%d]", r.index)))
		case pf.NumVFs == 0:
			// The agent does not create VFs: that is the node's setup
			// (sriov_numvfs, or the SR-IOV network operator).
			skips = append(skips, SkipPF(pf, "no VFs enabled (sriov_numvfs is 0)"))
		case len(pf.VFs) == 0:
			skips = append(skips, SkipPF(pf, fmt.Sprintf("sriov_numvfs is %d but no VF could be read", pf.NumVFs)))
		case pf.Netdev == "":
			skips = append(skips, SkipPF(pf, fmt.Sprintf("no netdev (driver %q): VFs are configured through the PF's netdev", pf.Driver)))
		default:
			offers = append(offers, NICOffer{PF: pf, Mode: r.mode, Bandwidth: r.bandwidth, Rule: r.index})
		}
	}
	return offers, skips
}

// match returns the first rule selecting pf, or nil and why none does. A
// PF carrying a default route is only selected by rules that name it.
func (c *AgentConfig) match(pf hw.PF) (*rule, string) {
	for i := range c.rules {
		r := &c.rules[i]
		if !matches(r.sel, pf) {
			continue
		}
		if pf.DefaultRoute && !names(r.sel, pf) {
			continue
		}
		return r, ""
	}
	if pf.DefaultRoute {
		return nil, "carries a default route of the node: offered only when a nics[].select names it in names or pciAddresses"
	}
	return nil, "no nics[] entry selects it"
}

// matches: every non-empty list of s holds pf's value.
func matches(s configv1alpha1.PFSelector, pf hw.PF) bool {
	in := func(list []string, v string) bool { return len(list) == 0 || slices.Contains(list, v) }
	return in(s.Names, pf.Netdev) && in(s.PCIAddresses, pf.PCIAddress) &&
		in(s.VendorIDs, pf.VendorID) && in(s.DeviceIDs, pf.DeviceID) && in(s.Drivers, pf.Driver)
}

// names: s lists pf by netdev name or PCI address.
func names(s configv1alpha1.PFSelector, pf hw.PF) bool {
	return (pf.Netdev != "" && slices.Contains(s.Names, pf.Netdev)) || slices.Contains(s.PCIAddresses, pf.PCIAddress)
}
