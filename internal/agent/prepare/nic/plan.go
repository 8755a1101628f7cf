// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"fmt"
	"sort"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	sriovv1alpha1 "github.com/hwdra/hwdra/api/sriov/v1alpha1"
	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/hw"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
)

// Assignment is what the plan decides for one allocation result of the
// driver: which VF, configured how.
type Assignment struct {
	Request, Pool, Device string
	ShareID               *types.UID
	// EnvPrefix starts the device's environment variable names
	// ("HWDRA_SRIOV_NIC_").
	EnvPrefix string
	// Admin: an admin-access result (monitoring): no VF, no side effects.
	Admin bool
	Mode  config.Mode
	PF    hw.PF
	VF    hw.VF
	// Published are the device's attributes in its ResourceSlice, which
	// its metadata carries.
	Published map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	// Config is what to set. KeepRate (exclusive VFs): the rate fields are
	// replaced by the VF's own before applying.
	Config   hw.VFConfig
	KeepRate bool
	// Bandwidth is a share's consumed bandwidth (bits/s), nil otherwise.
	Bandwidth *resource.Quantity
	Network   Network
}

// Plan decides, without touching anything, which VF each of the claim's
// sriov.hwdra.io results gets and with which settings. catalog is what
// the node publishes (resources.NICDevices); held maps the VFs other claims
// hold (by VF PCI address). nodeName must be every result's pool
// (prepare.OwnPool). policy says what the claim's own VfConfig may set on
// a PF's VFs beyond its class's (nil: nothing). Errors name the request
// and, for configuration, the field (the caller names the claim).
func Plan(claim *resourceapi.ResourceClaim, catalog map[string]resources.NICDevice, held map[string]types.UID, nodeName string, policy Policy) ([]Assignment, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("not allocated")
	}
	results := claim.Status.Allocation.Devices.Results
	perRequest := map[string]int{}
	for _, r := range results {
		if r.Driver == device.NICDriver {
			perRequest[r.Request]++
		}
	}
	var (
		out     []Assignment
		taken   = map[string]bool{} // VFs chosen by this plan
		seen    = map[string]int{}  // results of a request so far
		configs = map[string]requestConfig{}
	)
	for _, r := range results {
		if r.Driver != device.NICDriver {
			continue
		}
		a := Assignment{Request: r.Request, Pool: r.Pool, Device: r.Device, ShareID: r.ShareID,
			EnvPrefix: envPrefix(r.Request, seen[r.Request], perRequest[r.Request])}
		seen[r.Request]++
		if err := prepare.OwnPool(r, nodeName); err != nil {
			return nil, err
		}
		dev, ok := catalog[r.Device]
		if !ok {
			return nil, fmt.Errorf("request %q: device %s is not among this node's %s devices (gone since it was allocated?)", r.Request, r.Device, device.NICDriver)
		}
		a.Mode, a.PF, a.Published = dev.Mode, dev.PF, dev.Attributes
		if r.AdminAccess != nil && *r.AdminAccess {
			a.Admin = true
			out = append(out, a)
			continue
		}
		rc, ok := configs[r.Request]
		if !ok {
			var err error
			if rc, err = configFor(claim, r.Request); err != nil {
				return nil, err
			}
			configs[r.Request] = rc
		}
		cfg := rc.merged
		if err := pickVF(&a, r, dev, cfg, held, taken); err != nil {
			return nil, err
		}
		if err := check(a, rc, policy); err != nil {
			return nil, fmt.Errorf("request %q: %w", r.Request, err)
		}
		taken[a.VF.PCIAddress] = true
		a.Network = Network{InterfaceName: cfg.InterfaceName, Addresses: cfg.Addresses, Routes: cfg.Routes}
		out = append(out, a)
	}
	return out, nil
}

// pickVF gives a the VF of its result r: a free one of the PF for a
// share, with the share's rate; the VF itself for an exclusive device.
func pickVF(a *Assignment, r resourceapi.DeviceRequestAllocationResult, dev resources.NICDevice, cfg *sriovv1alpha1.VfConfig, held map[string]types.UID, taken map[string]bool) error {
	switch dev.Mode {
	case config.ModeShared:
		if r.ShareID == nil {
			return fmt.Errorf("request %q: shared device %s allocated without a shareID", r.Request, r.Device)
		}
		bw, ok := r.ConsumedCapacity[device.NICCapBandwidth]
		if !ok {
			return fmt.Errorf("request %q: share of %s consumes no %s", r.Request, r.Device, device.NICCapBandwidth)
		}
		mbps := bw.Value() / 1_000_000 // never above what was counted
		if mbps < 1 {
			// 0 would mean "no limit" to the kernel.
			return fmt.Errorf("request %q: share of %s: bandwidth %s is below 1 Mb/s, the VF rate limit's unit", r.Request, r.Device, bw.String())
		}
		vf, err := freeVF(dev.PF, held, taken)
		if err != nil {
			return fmt.Errorf("request %q: %w", r.Request, err)
		}
		a.VF, a.Bandwidth = vf, &bw
		a.Config = vfConfig(cfg, dev.PF, vf)
		if dev.PF.LinkType == hw.LinkInfiniBand {
			// No VF rate limit on an InfiniBand port: the share is
			// what the scheduler counts, not enforced on the wire.
			a.KeepRate = true
		} else {
			a.Config.MaxTxRateMbps = int(mbps)
			if takesMinRate(dev.PF.Driver) {
				a.Config.MinTxRateMbps = int(mbps)
			}
		}
	case config.ModeExclusive:
		vf := *dev.VF
		if owner, ok := held[vf.PCIAddress]; ok {
			return fmt.Errorf("request %q: VF %d of %s (%s) is still held by claim %s", r.Request, vf.Index, pfName(dev.PF), vf.PCIAddress, owner)
		}
		if taken[vf.PCIAddress] {
			return fmt.Errorf("request %q: VF %d of %s (%s) is allocated twice in this claim", r.Request, vf.Index, pfName(dev.PF), vf.PCIAddress)
		}
		a.VF, a.KeepRate = vf, true
		a.Config = vfConfig(cfg, dev.PF, vf)
	default:
		return fmt.Errorf("request %q: device %s has mode %q", r.Request, r.Device, dev.Mode)
	}
	return nil
}

// check refuses, before anything is touched, what the PF's link type has
// no use for, what the claim asks beyond its class's settings and the
// PF's policy, and what the PF's driver is known to refuse.
func check(a Assignment, rc requestConfig, policy Policy) error {
	if err := checkLinkType(a.PF, rc.merged); err != nil {
		return err
	}
	var pol config.VFPolicy
	if policy != nil {
		pol = policy.VFPolicy(a.PF)
	}
	if err := checkPolicy(rc, a.PF, pol); err != nil {
		return err
	}
	return checkQuirks(a.PF, a.Config)
}

// freeVF is the lowest-index VF of pf that is usable for a netdev share
// and held by no claim.
func freeVF(pf hw.PF, held map[string]types.UID, taken map[string]bool) (hw.VF, error) {
	vfs := pf.VFs
	if !sort.SliceIsSorted(vfs, func(i, j int) bool { return vfs[i].Index < vfs[j].Index }) {
		vfs = append([]hw.VF(nil), vfs...)
		sort.Slice(vfs, func(i, j int) bool { return vfs[i].Index < vfs[j].Index })
	}
	usable := 0
	for _, vf := range vfs {
		if !shareable(vf) {
			continue
		}
		usable++
		if _, ok := held[vf.PCIAddress]; !ok && !taken[vf.PCIAddress] {
			return vf, nil
		}
	}
	return hw.VF{}, fmt.Errorf("no free VF on PF %s: all %d of its %d VFs usable for a share (bound to a netdev driver, netdev in the host namespace) are held by claims",
		pfName(pf), usable, len(pf.VFs))
}

// shareable: a share is a netdev the NRI step moves into the pod, so its
// VF needs a kernel netdev driver and its netdev here (not in a pod that
// someone else moved it to). The slices count the former (their vfs
// capacity), so a free VF is there unless someone took one.
func shareable(vf hw.VF) bool { return vf.NetdevDriver() && vf.Netdev != "" }

// vfConfig is what a VfConfig asks of a VF, in the settings its link type
// takes (checkLinkType refuses the others). Rates are left for the caller.
func vfConfig(c *sriovv1alpha1.VfConfig, pf hw.PF, vf hw.VF) hw.VFConfig {
	var cfg hw.VFConfig
	if pf.LinkType == hw.LinkInfiniBand {
		cfg = hw.VFConfig{NodeGUID: c.NodeGUID, PortGUID: c.PortGUID}
	} else {
		cfg = hw.VFConfig{MAC: c.MAC, Trust: deref(c.Trust), SpoofChk: deref(c.SpoofCheck), VLAN: deref(c.VLAN), QoS: deref(c.VLANQoS)}
	}
	if vf.Netdev != "" { // no netdev (vfio-pci): no MTU to set
		cfg.MTU = pf.MTU
		if c.MTU != nil {
			cfg.MTU = *c.MTU
		}
	}
	return cfg
}

// checkLinkType refuses settings the PF's link type has no use for,
// naming the field: an InfiniBand VF is known by its node and port GUIDs
// and partitioned by P_Keys (no MAC, VLAN, trust or spoof check), an
// Ethernet VF has no GUIDs. Defaults (trust off, spoof checking on) are
// not settings the user made.
func checkLinkType(pf hw.PF, c *sriovv1alpha1.VfConfig) error {
	if pf.LinkType != hw.LinkInfiniBand {
		switch {
		case c.NodeGUID != "":
			return fmt.Errorf("nodeGUID: PF %s is an Ethernet port: only InfiniBand VFs have GUIDs", pfName(pf))
		case c.PortGUID != "":
			return fmt.Errorf("portGUID: PF %s is an Ethernet port: only InfiniBand VFs have GUIDs", pfName(pf))
		}
		return nil
	}
	ib := "PF " + pfName(pf) + " is an InfiniBand port, whose VFs "
	switch {
	case c.MAC != "":
		return fmt.Errorf("mac: %shave GUIDs (nodeGUID, portGUID), not MAC addresses", ib)
	case deref(c.VLAN) != 0 || c.VLANQoS != nil:
		return fmt.Errorf("vlan: %shave no VLANs (InfiniBand partitions by P_Key)", ib)
	case deref(c.Trust):
		return fmt.Errorf("trust: %shave no trust setting", ib)
	case c.SpoofCheck != nil && !*c.SpoofCheck:
		return fmt.Errorf("spoofCheck: %shave no MAC spoof checking", ib)
	}
	return nil
}

// takesMinRate: the PF's driver sets a VF's minimum transmit rate
// (min_tx_rate), so a share's bandwidth is guaranteed besides capped
// (max_tx_rate). What the drivers do with a minimum:
//
//   - mlx5_core: eswitch QoS's bandwidth share, a weight among the PF's
//     VFs (the largest minimum scaled to the firmware's maximum share):
//     under contention each VF gets at least its minimum while the
//     minimums fit the link, which the scheduler's count of the PF's
//     bandwidth keeps true for the agent's shares. Legacy and switchdev
//     mode alike; firmware without the eswitch bandwidth-share capability
//     (esw_bw_share, or a maximum share below 1) refuses any minimum with
//     EOPNOTSUPP (Driver.apply then sets the cap alone).
//   - ice: a VSI minimum bandwidth in the port's Tx scheduler. Refused
//     with EOPNOTSUPP while DCB is on for the PF (Driver.apply then sets
//     the cap alone), and with EINVAL when the minimums of all its VFs
//     would add up beyond the link speed (VFs given minimums outside the
//     agent, or a link that came back slower than published).
//   - i40e, ixgbe (and drivers not listed): any minimum is EINVAL; a share
//     is capped only.
func takesMinRate(driver string) bool { return driver == "mlx5_core" || driver == "ice" }

// checkQuirks refuses, before anything is touched, what the PF's driver is
// known to refuse half-way through SetVF.
func checkQuirks(pf hw.PF, cfg hw.VFConfig) error {
	// mlx5 in switchdev mode: the PF's VF VLAN setting is legacy-mode only
	// (EOPNOTSUPP for any VLAN but 0); VLANs belong on the representor.
	if pf.Driver == "mlx5_core" && pf.EswitchMode == "switchdev" && (cfg.VLAN != 0 || cfg.QoS != 0) {
		return fmt.Errorf("vlan: PF %s is in switchdev mode, where mlx5 sets no VF port VLAN (put the VLAN on the VF representor, or use a legacy-mode PF)", pfName(pf))
	}
	return nil
}

// envPrefix: "HWDRA_SRIOV_<REQUEST>_", with the device's index when the
// request has several.
func envPrefix(request string, i, n int) string {
	if n > 1 {
		return prepare.EnvName("SRIOV", request, strconv.Itoa(i)) + "_"
	}
	return prepare.EnvName("SRIOV", request) + "_"
}

func pfName(pf hw.PF) string {
	if pf.Netdev == "" {
		return pf.PCIAddress
	}
	return pf.Netdev + " (" + pf.PCIAddress + ")"
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
