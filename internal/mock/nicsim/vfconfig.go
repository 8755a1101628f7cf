// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nicsim

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

// VFRecord is one SetVF call and how the "hardware" answered it.
type VFRecord struct {
	Ref    hw.VFRef
	Config hw.VFConfig
	Err    error
}

// VFRecorder is the mock's hw.VFConfigurator. VF setters return "operation
// not supported" on the veth links that stand in for VFs, so it keeps the
// VF state itself, refuses what the drivers refuse (with the errno they
// return) and records every call. With veth stand-ins, MTU and link state
// also go to the VF's veth.
type VFRecorder struct {
	mu      sync.Mutex
	pfs     map[string]*recPF // by PF netdev
	records []VFRecord
	// netdev applies MTU/link state to a stand-in netdev; nil without.
	netdev func(name string, mtu int, up *bool) error
	// fault, when set, is asked before each field is applied.
	fault func(ref hw.VFRef, field string) error
	// rep is told of each SetVF (it saves the node's state and paces
	// the calls).
	rep persist.Reporter
}

type recPF struct {
	speedMbps int // 0 while the link is down
	maxMTU    int
	rateCheck bool
	// vlanLegacyOnly: the driver sets a VF's port VLAN only in legacy
	// eswitch mode (mlx5 in switchdev mode).
	vlanLegacyOnly bool
	// noMinRate: a VF minimum rate is EOPNOTSUPP (mlx5 firmware without
	// eswitch bandwidth share, ice with DCB on); minRateFitsLink: one that
	// makes the VFs' minimums add up beyond the link speed is EINVAL (ice).
	noMinRate, minRateFitsLink bool
	// infiniband: the port's VFs take GUIDs, MTU and link state and
	// refuse every Ethernet setting (EOPNOTSUPP).
	infiniband bool
	vfs        []recVF
}

type recVF struct {
	netdev string
	cfg    hw.VFConfig
}

var _ hw.VFConfigurator = (*VFRecorder)(nil)

func newVFRecorder(pfs []*mockPF, rep persist.Reporter) *VFRecorder {
	r := &VFRecorder{pfs: map[string]*recPF{}, rep: rep}
	for _, pf := range pfs {
		p := &recPF{maxMTU: pf.model.MaxMTU, rateCheck: pf.model.VFRateNeedsLinkMax,
			vlanLegacyOnly: pf.model.Driver == "mlx5_core" && pf.eswitch == "switchdev",
			noMinRate:      pf.noMinRate, minRateFitsLink: pf.model.VFMinRateFitsLink,
			infiniband: pf.linkType == hw.LinkInfiniBand}
		if pf.linkUp {
			p.speedMbps = pf.speedMbps
		}
		for _, vf := range pf.vfs {
			cfg := hw.VFConfig{MAC: "00:00:00:00:00:00", SpoofChk: pf.model.VFSpoofChkDefault}
			if p.infiniband {
				cfg = hw.VFConfig{NodeGUID: "00:00:00:00:00:00:00:00", PortGUID: "00:00:00:00:00:00:00:00"}
			}
			if vf.netdev != "" {
				cfg.MTU = pf.mtu
				cfg.NetdevUp = new(bool)
			}
			p.vfs = append(p.vfs, recVF{netdev: vf.netdev, cfg: cfg})
		}
		r.pfs[pf.netdev] = p
	}
	return r
}

// GetVF implements hw.VFConfigurator.
func (r *VFRecorder) GetVF(ref hw.VFRef) (hw.VFConfig, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	vf, err := r.lookup(ref)
	if err != nil {
		return hw.VFConfig{}, err
	}
	cfg := vf.cfg
	if ref.Netdev == "" {
		cfg.MTU, cfg.NetdevUp = 0, nil
	} else if cfg.NetdevUp != nil {
		cfg.NetdevUp = ptrTo(*cfg.NetdevUp)
	}
	return cfg, nil
}

// SetVF implements hw.VFConfigurator: fields apply in the documented order
// and the first refused one stops it, leaving the earlier ones applied.
func (r *VFRecorder) SetVF(ref hw.VFRef, cfg hw.VFConfig) error {
	err := r.set(ref, cfg)
	// A refused field leaves the earlier ones applied: saved either way.
	r.rep.Changed(persist.CallSetVF, ref.PF, true)
	return err
}

func (r *VFRecorder) set(ref hw.VFRef, cfg hw.VFConfig) error {
	r.mu.Lock()
	defer r.mu.Unlock() // also when a fault ends the goroutine
	err := r.apply(ref, cfg)
	if cfg.NetdevUp != nil {
		cfg.NetdevUp = ptrTo(*cfg.NetdevUp)
	}
	r.records = append(r.records, VFRecord{Ref: ref, Config: cfg, Err: err})
	return err
}

func (r *VFRecorder) apply(ref hw.VFRef, cfg hw.VFConfig) error {
	vf, err := r.lookup(ref)
	if err != nil {
		return err
	}
	pf := r.pfs[ref.PF]
	fail := func(what string, err error) error {
		return fmt.Errorf("mock: VF %d of %s: setting %s: %w", ref.Index, ref.PF, what, err)
	}
	faulty := func(what string) error {
		if r.fault == nil {
			return nil
		}
		if err := r.fault(ref, what); err != nil {
			return fail(what, err)
		}
		return nil
	}
	if pf.infiniband {
		if err := r.applyInfiniBand(vf, cfg, faulty, fail); err != nil {
			return err
		}
		return r.applyNetdev(ref, vf, pf, cfg, faulty, fail)
	}
	if cfg.MAC != "" {
		if err := faulty("MAC"); err != nil {
			return err
		}
		mac, err := net.ParseMAC(cfg.MAC)
		if err != nil || len(mac) != 6 || mac[0]&1 == 1 { // multicast
			return fail("MAC", unix.EINVAL)
		}
		vf.cfg.MAC = mac.String()
	}
	if err := faulty("VLAN"); err != nil {
		return err
	}
	if cfg.VLAN < 0 || cfg.VLAN > 4094 || cfg.QoS < 0 || cfg.QoS > 7 {
		return fail("VLAN", unix.EINVAL)
	}
	if pf.vlanLegacyOnly && (cfg.VLAN != 0 || cfg.QoS != 0) {
		// mlx5 in switchdev mode: VLAN 0 is accepted (libvirt sets it),
		// any other port VLAN is EOPNOTSUPP; VLANs go on the representor.
		return fail("VLAN", unix.EOPNOTSUPP)
	}
	vf.cfg.VLAN, vf.cfg.QoS = cfg.VLAN, cfg.QoS
	if err := faulty("rate"); err != nil {
		return err
	}
	switch {
	case cfg.MinTxRateMbps < 0 || cfg.MaxTxRateMbps < 0:
		return fail("rate", unix.EINVAL)
	case cfg.MaxTxRateMbps != 0 && cfg.MinTxRateMbps > cfg.MaxTxRateMbps:
		return fail("rate", unix.EINVAL)
	case pf.rateCheck && pf.speedMbps > 0 && max(cfg.MinTxRateMbps, cfg.MaxTxRateMbps) > pf.speedMbps:
		// mlx5 and ice refuse a VF rate above the link speed.
		return fail("rate", unix.EINVAL)
	case cfg.MinTxRateMbps != 0 && pf.noMinRate:
		return fail("rate", unix.EOPNOTSUPP)
	case cfg.MinTxRateMbps != 0 && pf.minRateFitsLink && pf.speedMbps > 0 && pf.minRates(ref.Index)+cfg.MinTxRateMbps > pf.speedMbps:
		// ice: the VFs' minimums must fit the link.
		return fail("rate", unix.EINVAL)
	}
	vf.cfg.MinTxRateMbps, vf.cfg.MaxTxRateMbps = cfg.MinTxRateMbps, cfg.MaxTxRateMbps
	if err := faulty("spoofchk"); err != nil {
		return err
	}
	vf.cfg.SpoofChk = cfg.SpoofChk
	if err := faulty("trust"); err != nil {
		return err
	}
	vf.cfg.Trust = cfg.Trust
	return r.applyNetdev(ref, vf, pf, cfg, faulty, fail)
}

// minRates is the sum of the minimum rates of the PF's VFs but one.
func (pf *recPF) minRates(except int) int {
	sum := 0
	for i, vf := range pf.vfs {
		if i != except {
			sum += vf.cfg.MinTxRateMbps
		}
	}
	return sum
}

// applyInfiniBand: an InfiniBand VF takes GUIDs only; any Ethernet setting
// asked of it is refused, as the driver refuses the netlink call (a VF
// config read back has them zero, so restoring one passes).
func (r *VFRecorder) applyInfiniBand(vf *recVF, cfg hw.VFConfig, faulty func(string) error, fail func(string, error) error) error {
	switch {
	case cfg.MAC != "":
		return fail("MAC", unix.EOPNOTSUPP)
	case cfg.VLAN != 0 || cfg.QoS != 0:
		return fail("VLAN", unix.EOPNOTSUPP)
	case cfg.MinTxRateMbps != 0 || cfg.MaxTxRateMbps != 0:
		return fail("rate", unix.EOPNOTSUPP)
	case cfg.SpoofChk || cfg.Trust:
		return fail("spoofchk", unix.EOPNOTSUPP)
	}
	for _, g := range []struct {
		what string
		val  string
		dst  *string
	}{{"node GUID", cfg.NodeGUID, &vf.cfg.NodeGUID}, {"port GUID", cfg.PortGUID, &vf.cfg.PortGUID}} {
		if g.val == "" {
			continue
		}
		if err := faulty(g.what); err != nil {
			return err
		}
		guid, err := net.ParseMAC(g.val)
		if err != nil || len(guid) != 8 {
			return fail(g.what, unix.EINVAL)
		}
		*g.dst = guid.String()
	}
	return nil
}

// applyNetdev applies MTU and link state to the VF's netdev.
func (r *VFRecorder) applyNetdev(ref hw.VFRef, vf *recVF, pf *recPF, cfg hw.VFConfig, faulty func(string) error, fail func(string, error) error) error {
	if ref.Netdev == "" {
		return nil
	}
	if cfg.MTU != 0 {
		if err := faulty("MTU"); err != nil {
			return err
		}
		if cfg.MTU < 68 || cfg.MTU > pf.maxMTU {
			return fail("MTU", unix.EINVAL)
		}
		if r.netdev != nil {
			if err := r.netdev(ref.Netdev, cfg.MTU, nil); err != nil {
				return fail("MTU", err)
			}
		}
		vf.cfg.MTU = cfg.MTU
	}
	if cfg.NetdevUp != nil {
		if err := faulty("link state"); err != nil {
			return err
		}
		if r.netdev != nil {
			if err := r.netdev(ref.Netdev, 0, cfg.NetdevUp); err != nil {
				return fail("link state", err)
			}
		}
		vf.cfg.NetdevUp = ptrTo(*cfg.NetdevUp)
	}
	return nil
}

// lookup finds the VF, refusing what netlink would: an unknown PF
// (ENODEV), an index past sriov_numvfs (EINVAL), a netdev that is not
// that VF's (ENODEV).
func (r *VFRecorder) lookup(ref hw.VFRef) (*recVF, error) {
	pf, ok := r.pfs[ref.PF]
	if !ok {
		return nil, fmt.Errorf("mock: PF %q: %w", ref.PF, unix.ENODEV)
	}
	if ref.Index < 0 || ref.Index >= len(pf.vfs) {
		return nil, fmt.Errorf("mock: PF %s has no VF %d: %w", ref.PF, ref.Index, unix.EINVAL)
	}
	vf := &pf.vfs[ref.Index]
	if ref.Netdev != "" && ref.Netdev != vf.netdev {
		return nil, fmt.Errorf("mock: VF %d of %s has no netdev %q: %w", ref.Index, ref.PF, ref.Netdev, unix.ENODEV)
	}
	return vf, nil
}

// SetFault installs f (nil removes it): SetVF asks it before applying each
// field ("MAC", "VLAN", "rate", "spoofchk", "trust", "MTU", "link state",
// in that order, skipping those the call does not set) and stops with its
// error, leaving the earlier fields applied as a refusing driver would.
// Tests inject refusals this way, or crashes (f calls runtime.Goexit).
func (r *VFRecorder) SetFault(f func(ref hw.VFRef, field string) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fault = f
}

// VFSettings are the settings a PF can be made to refuse
// (RefuseVFSetting), as SetVF applies them.
var VFSettings = []string{"MAC", "VLAN", "rate", "spoofchk", "trust", "node GUID", "port GUID", "MTU", "link state"}

// RefuseVFSetting makes a PF (netdev name or PCI address) refuse one
// setting of its VFs with EPERM (fault.VFRefuse); "" takes every setting
// again. It replaces any fault set before.
func (n *NICs) RefuseVFSetting(pf, setting string) error {
	p, err := n.pf(pf)
	if err != nil {
		return err
	}
	if setting == "" {
		n.recorder.SetFault(nil)
		return nil
	}
	if !slices.Contains(VFSettings, setting) {
		return fmt.Errorf("vf-refuse: no VF setting %q (settings: %s)", setting, strings.Join(VFSettings, ", "))
	}
	n.recorder.SetFault(func(ref hw.VFRef, field string) error {
		if ref.PF == p.netdev && field == setting {
			return unix.EPERM
		}
		return nil
	})
	return nil
}

// Snapshot is the state of every VF, keyed "<pf netdev>/<index>", with
// MTU and link state for VFs that have a netdev: what a test compares to
// tell that nothing changed.
func (r *VFRecorder) Snapshot() map[string]hw.VFConfig {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]hw.VFConfig{}
	for name, pf := range r.pfs {
		for i, vf := range pf.vfs {
			cfg := vf.cfg
			if cfg.NetdevUp != nil {
				cfg.NetdevUp = ptrTo(*cfg.NetdevUp)
			}
			out[fmt.Sprintf("%s/%d", name, i)] = cfg
		}
	}
	return out
}

// Records returns every SetVF call so far, in order.
func (r *VFRecorder) Records() []VFRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]VFRecord(nil), r.records...)
}

// rename records a VF netdev's current name in the host ("" while it is
// in another namespace): SetVF and GetVF address it by that name, as
// netlink does.
func (r *VFRecorder) rename(pf string, index int, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.pfs[pf]; ok && index < len(p.vfs) {
		p.vfs[index].netdev = name
	}
}

// vfConfig is a VF's current configuration.
func (r *VFRecorder) vfConfig(pf string, index int) hw.VFConfig {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.pfs[pf]; ok && index < len(p.vfs) {
		return p.vfs[index].cfg
	}
	return hw.VFConfig{}
}

func ptrTo[T any](v T) *T { return &v }
