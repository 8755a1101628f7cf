// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package profile

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/model"
)

// NICGroup is Count identical SR-IOV NICs, one PF each (a dual-port card is
// two PFs: give them addresses .0 and .1 of one device).
type NICGroup struct {
	// Model is one of model.NICNames(): "cx6", "cx7", "e810".
	Model string `json:"model"`
	Count int    `json:"count"`
	// VFs is sriov_numvfs at start (default 0, as after boot).
	VFs int `json:"vfs,omitempty"`
	// TotalVFs is sriov_totalvfs; default the model's.
	TotalVFs int `json:"totalVFs,omitempty"`
	// NUMANodes has Count entries (-1: unknown); default all 0.
	NUMANodes []int `json:"numaNodes,omitempty"`
	// PCIAddresses has Count entries ("0000:18:00.0"); default: a free bus
	// per PF. VFs follow their PF on the same bus.
	PCIAddresses []string `json:"pciAddresses,omitempty"`
	// PCIeRoots has Count entries ("pci0000:15"); default the bus above the PF.
	PCIeRoots []string `json:"pcieRoots,omitempty"`
	// Netdevs has Count PF netdev names; default from the address
	// ("enp24s0f0", "ibp24s0f0"). VF netdevs are the PF's name plus "v<index>".
	Netdevs []string `json:"netdevs,omitempty"`
	// SpeedMbps overrides the model's link speed.
	SpeedMbps int `json:"speedMbps,omitempty"`
	// LinkUp is the PFs' link state (default true). A down link reports
	// operstate down, carrier 0 and speed -1, as the kernel does.
	LinkUp *bool `json:"linkUp,omitempty"`
	// VFDriver binds the VFs: the model's netdev driver (default),
	// "vfio-pci" (no netdev), or "none" (unbound).
	VFDriver string `json:"vfDriver,omitempty"`
	// DefaultRoute is the index within the group of a PF that carries the
	// node's default route.
	DefaultRoute *int `json:"defaultRoute,omitempty"`
	// LinkType is "ethernet" (default) or "infiniband" where the model has it.
	LinkType hw.LinkType `json:"linkType,omitempty"`
	// RDMA overrides whether the RDMA device exists (e810 + irdma).
	RDMA *bool `json:"rdma,omitempty"`
	// EswitchMode is devlink's answer: "legacy", "switchdev" (VF
	// representors appear next to the uplink) or "none" (no devlink).
	EswitchMode string `json:"eswitchMode,omitempty"`
	// MTU of the PF netdevs (default 1500, 4092 on InfiniBand).
	MTU int `json:"mtu,omitempty"`
	// VFMinTxRate: the driver sets VFs' minimum transmit rates (default
	// true). false is mlx5 firmware without the eswitch bandwidth share
	// (esw_bw_share) or ice with DCB on: a minimum is EOPNOTSUPP.
	VFMinTxRate *bool `json:"vfMinTxRate,omitempty"`
	// Timings slow the group's PFs down: how long a VF configuration call
	// takes, e.g. {setVF: 3s} (see NICTimings). Not part of the hardware,
	// like GPUGroup.Timings.
	Timings *NICTimings `json:"timings,omitempty"`
}

var (
	pciAddressRE = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$`)
	pcieRootRE   = regexp.MustCompile(`^pci[0-9a-f]{4}:[0-9a-f]{2}$`)
	netdevNameRE = regexp.MustCompile(`^[a-zA-Z0-9_.-]+$`)
)

// maxNetdevName is IFNAMSIZ minus the terminating NUL.
const maxNetdevName = 15

// validate checks one NIC group; errors start with the field name.
func (g NICGroup) validate() error {
	m, ok := model.LookupNIC(g.Model)
	if !ok {
		return fmt.Errorf("model: unknown NIC model %q (known: %s)", g.Model, strings.Join(model.NICNames(), ", "))
	}
	if g.Count < 1 {
		return fmt.Errorf("count: must be at least 1")
	}
	total := g.SriovTotalVFs(m)
	switch {
	case g.TotalVFs < 0:
		return fmt.Errorf("totalVFs: must not be negative")
	case g.VFs < 0:
		return fmt.Errorf("vfs: must not be negative")
	case g.VFs > total:
		return fmt.Errorf("vfs: %d is more than sriov_totalvfs (%d)", g.VFs, total)
	case total > 248:
		return fmt.Errorf("totalVFs: at most 248 (the VFs share their PF's PCI bus)")
	}
	if err := g.validateLists(total); err != nil {
		return err
	}
	if g.SpeedMbps < 0 {
		return fmt.Errorf("speedMbps: must not be negative")
	}
	switch g.VFDriver {
	case "", m.VFDriver, "vfio-pci", "none":
	default:
		return fmt.Errorf("vfDriver: %q is not %s, vfio-pci or none", g.VFDriver, m.VFDriver)
	}
	if g.DefaultRoute != nil && (*g.DefaultRoute < 0 || *g.DefaultRoute >= g.Count) {
		return fmt.Errorf("defaultRoute: %d is not a PF index of this group (0-%d)", *g.DefaultRoute, g.Count-1)
	}
	if g.LinkType != "" && !m.HasLinkType(g.LinkType) {
		return fmt.Errorf("linkType: %s has no %q link (has %v)", g.Model, g.LinkType, m.LinkTypes)
	}
	switch g.EswitchMode {
	case "", "legacy", "switchdev", "none":
	default:
		return fmt.Errorf("eswitchMode: %q is not legacy, switchdev or none", g.EswitchMode)
	}
	if g.MTU != 0 && (g.MTU < 68 || g.MTU > m.MaxMTU) {
		return fmt.Errorf("mtu: %d is outside 68-%d", g.MTU, m.MaxMTU)
	}
	_, err := g.Timings.Durations()
	return err
}

func (g NICGroup) validateLists(totalVFs int) error {
	for name, n := range map[string]int{"numaNodes": len(g.NUMANodes), "pciAddresses": len(g.PCIAddresses),
		"pcieRoots": len(g.PCIeRoots), "netdevs": len(g.Netdevs)} {
		if n != 0 && n != g.Count {
			return fmt.Errorf("%s: has %d entries, count is %d", name, n, g.Count)
		}
	}
	for i, n := range g.NUMANodes {
		if n < -1 {
			return fmt.Errorf("numaNodes[%d]: %d is not a NUMA node (-1 for unknown)", i, n)
		}
	}
	seen := map[string]bool{}
	for i, a := range g.PCIAddresses {
		if !pciAddressRE.MatchString(a) {
			return fmt.Errorf("pciAddresses[%d]: %q is not a lower-case PCI address like 0000:18:00.0", i, a)
		}
		if seen[a] {
			return fmt.Errorf("pciAddresses[%d]: %s appears twice", i, a)
		}
		seen[a] = true
	}
	for i, r := range g.PCIeRoots {
		if !pcieRootRE.MatchString(r) {
			return fmt.Errorf("pcieRoots[%d]: %q is not a PCIe root like pci0000:15", i, r)
		}
	}
	suffix := len(fmt.Sprintf("v%d", totalVFs-1))
	for i, n := range g.Netdevs {
		if !netdevNameRE.MatchString(n) || len(n)+suffix > maxNetdevName {
			return fmt.Errorf("netdevs[%d]: %q must be at most %d characters of [a-zA-Z0-9_.-] (VF names add %q)",
				i, n, maxNetdevName-suffix, "v<index>")
		}
	}
	return nil
}

// SriovTotalVFs is the PFs' sriov_totalvfs: the group's, or the model's.
func (g NICGroup) SriovTotalVFs(m model.NIC) int {
	if g.TotalVFs > 0 {
		return g.TotalVFs
	}
	return m.TotalVFs
}
