// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/hwdra/hwdra/internal/hw"
)

// NetlinkVFConfigurator sets VF attributes through the PF's netdev, like
// `ip link set <pf> vf <n> ...`, in the current network namespace. MTU and
// link state act on the VF's own netdev, which must be in that namespace.
//
// An InfiniBand port's VFs take node and port GUIDs and refuse the
// Ethernet settings (MAC, VLAN, spoof checking, trust; mlx5 also rate
// limits only Ethernet VFs), so on such a port only GUIDs are sent.
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
	var cfg hw.VFConfig
	if infiniband(pf) {
		// Netlink's VF info has no GUIDs; mlx5 shows them in sysfs.
		dir := filepath.Join(DefaultSysfsRoot, "class", "net", ref.PF, "device", "sriov", strconv.Itoa(ref.Index))
		cfg.NodeGUID, _ = readTrimmed(filepath.Join(dir, "node"))
		cfg.PortGUID, _ = readTrimmed(filepath.Join(dir, "port"))
	} else {
		cfg = hw.VFConfig{
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

func infiniband(l netlink.Link) bool { return l.Attrs().EncapType == "infiniband" }

func readTrimmed(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

// vfFields are the settings SetVF sends through the PF, in order, for a
// port of the link type: what the VF takes.
func vfFields(infiniband bool, cfg hw.VFConfig) []string {
	if infiniband {
		var out []string
		if cfg.NodeGUID != "" {
			out = append(out, "node GUID")
		}
		if cfg.PortGUID != "" {
			out = append(out, "port GUID")
		}
		return out
	}
	out := []string{"VLAN", "rate", "spoofchk", "trust"}
	if cfg.MAC != "" {
		out = append([]string{"MAC"}, out...)
	}
	return out
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
	guid := func(s string) (net.HardwareAddr, error) {
		g, err := net.ParseMAC(s)
		if err == nil && len(g) != 8 {
			err = fmt.Errorf("%q is not an 8-byte GUID", s)
		}
		return g, err
	}
	for _, field := range vfFields(infiniband(pf), cfg) {
		var err error
		switch field {
		case "MAC":
			var mac net.HardwareAddr
			if mac, err = net.ParseMAC(cfg.MAC); err == nil {
				err = netlink.LinkSetVfHardwareAddr(pf, ref.Index, mac)
			}
		case "VLAN":
			err = netlink.LinkSetVfVlanQos(pf, ref.Index, cfg.VLAN, cfg.QoS)
		case "rate":
			err = netlink.LinkSetVfRate(pf, ref.Index, cfg.MinTxRateMbps, cfg.MaxTxRateMbps)
		case "spoofchk":
			err = netlink.LinkSetVfSpoofchk(pf, ref.Index, cfg.SpoofChk)
		case "trust":
			err = netlink.LinkSetVfTrust(pf, ref.Index, cfg.Trust)
		case "node GUID":
			var g net.HardwareAddr
			if g, err = guid(cfg.NodeGUID); err == nil {
				err = netlink.LinkSetVfNodeGUID(pf, ref.Index, g)
			}
		case "port GUID":
			var g net.HardwareAddr
			if g, err = guid(cfg.PortGUID); err == nil {
				err = netlink.LinkSetVfPortGUID(pf, ref.Index, g)
			}
		}
		if err != nil {
			return fail(field, err)
		}
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
