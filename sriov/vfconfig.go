package sriov

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"

	"github.com/hwdra/hwdra/hw"
)

// NetlinkVFConfigurator sets VF attributes through the PF's netdev, like
// `ip link set <pf> vf <n> ...`, in the current network namespace. MTU and
// link state act on the VF's own netdev, which must be in that namespace.
type NetlinkVFConfigurator struct{}

var _ hw.VFConfigurator = NetlinkVFConfigurator{}

// GetVF implements hw.VFConfigurator.
func (NetlinkVFConfigurator) GetVF(ref hw.VFRef) (hw.VFConfig, error) {
	pf, err := netlink.LinkByName(ref.PF)
	if err != nil {
		return hw.VFConfig{}, fmt.Errorf("sriov: PF %s: %w", ref.PF, err)
	}
	var info *netlink.VfInfo
	for i := range pf.Attrs().Vfs {
		if pf.Attrs().Vfs[i].ID == ref.Index {
			info = &pf.Attrs().Vfs[i]
		}
	}
	if info == nil {
		return hw.VFConfig{}, fmt.Errorf("sriov: PF %s has no VF %d", ref.PF, ref.Index)
	}
	cfg := hw.VFConfig{
		VLAN:          info.Vlan,
		QoS:           info.Qos,
		MinTxRateMbps: int(info.MinTxRate),
		MaxTxRateMbps: int(info.MaxTxRate),
		SpoofChk:      info.Spoofchk,
		Trust:         info.Trust != 0,
	}
	if len(info.Mac) > 0 {
		cfg.MAC = info.Mac.String()
	}
	// Old kernels report only the legacy IFLA_VF_TX_RATE.
	if cfg.MaxTxRateMbps == 0 && info.TxRate > 0 {
		cfg.MaxTxRateMbps = info.TxRate
	}
	if ref.Netdev != "" {
		vf, err := netlink.LinkByName(ref.Netdev)
		if err != nil {
			return hw.VFConfig{}, fmt.Errorf("sriov: VF %d of %s: netdev %s: %w", ref.Index, ref.PF, ref.Netdev, err)
		}
		cfg.MTU = vf.Attrs().MTU
		up := vf.Attrs().Flags&net.FlagUp != 0
		cfg.NetdevUp = &up
	}
	return cfg, nil
}

// SetVF implements hw.VFConfigurator.
func (NetlinkVFConfigurator) SetVF(ref hw.VFRef, cfg hw.VFConfig) error {
	pf, err := netlink.LinkByName(ref.PF)
	if err != nil {
		return fmt.Errorf("sriov: PF %s: %w", ref.PF, err)
	}
	fail := func(what string, err error) error {
		return fmt.Errorf("sriov: VF %d of %s: setting %s: %w", ref.Index, ref.PF, what, err)
	}
	if cfg.MAC != "" {
		mac, err := net.ParseMAC(cfg.MAC)
		if err != nil {
			return fail("MAC", err)
		}
		if err := netlink.LinkSetVfHardwareAddr(pf, ref.Index, mac); err != nil {
			return fail("MAC", err)
		}
	}
	if err := netlink.LinkSetVfVlanQos(pf, ref.Index, cfg.VLAN, cfg.QoS); err != nil {
		return fail("VLAN", err)
	}
	if err := netlink.LinkSetVfRate(pf, ref.Index, cfg.MinTxRateMbps, cfg.MaxTxRateMbps); err != nil {
		return fail("rate", err)
	}
	if err := netlink.LinkSetVfSpoofchk(pf, ref.Index, cfg.SpoofChk); err != nil {
		return fail("spoofchk", err)
	}
	if err := netlink.LinkSetVfTrust(pf, ref.Index, cfg.Trust); err != nil {
		return fail("trust", err)
	}
	if ref.Netdev == "" || (cfg.MTU == 0 && cfg.NetdevUp == nil) {
		return nil
	}
	vf, err := netlink.LinkByName(ref.Netdev)
	if err != nil {
		return fail("netdev "+ref.Netdev, err)
	}
	if cfg.MTU != 0 && cfg.MTU != vf.Attrs().MTU {
		if err := netlink.LinkSetMTU(vf, cfg.MTU); err != nil {
			return fail("MTU", err)
		}
	}
	if cfg.NetdevUp != nil {
		set := netlink.LinkSetDown
		if *cfg.NetdevUp {
			set = netlink.LinkSetUp
		}
		if err := set(vf); err != nil {
			return fail("link state", err)
		}
	}
	return nil
}
