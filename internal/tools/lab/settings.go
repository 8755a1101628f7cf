// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"fmt"
	"io"
	"sort"
	"strings"

	gpuv1alpha1 "github.com/hwdra/hwdra/api/gpu/v1alpha1"
	"github.com/hwdra/hwdra/internal/agent"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/hw"
)

// computeModes reads each GPU's compute mode (none without NVML).
func computeModes(node *backend.Node, inv hw.Inventory) map[string]nvml.ComputeMode {
	modes := map[string]nvml.ComputeMode{}
	if node.GPU() == nil {
		return modes
	}
	for _, g := range inv.GPUs {
		if m, err := node.GPU().ComputeMode(g.PCIBusID); err == nil {
			modes[g.PCIBusID] = m
		}
	}
	return modes
}

// printSettings shows the settings prepare made for sharing and VFs, read
// back from the hardware where it tells them: each GPU's compute mode
// where it changed, the time slice a claim set (nvidia-smi does not tell
// it back: shown as prepare recorded it), each claimed VF's settings as
// its PF reads them now.
func printSettings(out io.Writer, node *backend.Node, inv hw.Inventory, modesBefore map[string]nvml.ComputeMode, drivers agent.Drivers) {
	slices := map[string]int{}
	shared := map[string]bool{} // GPUs whose settings a claim's sharing set
	if drivers.GPU != nil {
		for _, c := range drivers.GPU.Plugin.Claims() {
			for _, d := range c.Record.Devices {
				if d.Sharing == nil || d.Sharing.ComputeMode == "" && d.Sharing.TimeSlice == nil {
					continue
				}
				shared[d.GPU] = true
				if d.Sharing.TimeSlice != nil {
					slices[d.GPU] = *d.Sharing.TimeSlice
				}
			}
		}
	}
	modesNow := computeModes(node, inv)
	for _, g := range inv.GPUs {
		var parts []string
		now, was := modesNow[g.PCIBusID], modesBefore[g.PCIBusID]
		switch {
		case now != was:
			parts = append(parts, fmt.Sprintf("compute mode %s (was %s)", now, was))
		case shared[g.PCIBusID] && now != "":
			parts = append(parts, fmt.Sprintf("compute mode %s (as it was)", now))
		}
		if n, ok := slices[g.PCIBusID]; ok && n >= 0 && n < len(gpuv1alpha1.Intervals) {
			parts = append(parts, fmt.Sprintf("time slice %s (as prepare set it: nvidia-smi does not tell it back)", gpuv1alpha1.Intervals[n]))
		}
		if len(parts) > 0 {
			fmt.Fprintf(out, "GPU %s: %s\n", g.PCIBusID, strings.Join(parts, ", "))
		}
	}
	if drivers.NIC == nil || node.VFs == nil {
		return
	}
	var lines []string
	for _, c := range drivers.NIC.Plugin.Claims() {
		for _, vf := range c.Record.VFs {
			line := fmt.Sprintf("VF %s (%s VF %d) of claim %s: ", vf.PCIAddress, vf.PF, vf.Index, c.Name)
			cfg, err := node.VFs.GetVF(hw.VFRef{PF: vf.PF, Index: vf.Index, Netdev: vf.Netdev})
			if err != nil {
				lines = append(lines, line+"settings not read: "+err.Error())
				continue
			}
			lines = append(lines, line+vfSettings(cfg))
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Fprintln(out, l)
	}
}

// vfSettings are the settings prepare sets on a VF, in words.
func vfSettings(c hw.VFConfig) string {
	rate := func(mbps int) string {
		if mbps == 0 {
			return "none"
		}
		return fmt.Sprintf("%d Mb/s", mbps)
	}
	parts := []string{"max tx rate " + rate(c.MaxTxRateMbps), "min tx rate " + rate(c.MinTxRateMbps)}
	if c.NodeGUID != "" || c.PortGUID != "" {
		// InfiniBand: the Ethernet settings do not apply (they read as zero).
		parts = append(parts, "node GUID "+c.NodeGUID, "port GUID "+c.PortGUID)
	} else {
		vlan := "none"
		if c.VLAN != 0 {
			vlan = fmt.Sprintf("%d (QoS %d)", c.VLAN, c.QoS)
		}
		parts = append(parts, "VLAN "+vlan, "trust "+onOff(c.Trust), "spoof check "+onOff(c.SpoofChk))
		if c.MAC != "" {
			parts = append(parts, "MAC "+c.MAC)
		}
	}
	if c.MTU != 0 {
		parts = append(parts, fmt.Sprintf("MTU %d", c.MTU))
	}
	if c.NetdevUp != nil {
		parts = append(parts, "link "+map[bool]string{true: "up", false: "down"}[*c.NetdevUp])
	}
	return strings.Join(parts, ", ")
}

// vfChanges are the settings of a VF that differ from what it had
// ("max tx rate 10000 Mb/s (was none), trust on (was off)"), those its PF
// reports: MTU and link state only where both are known.
func vfChanges(now, was hw.VFConfig) string {
	rate := func(mbps int) string {
		if mbps == 0 {
			return "none"
		}
		return fmt.Sprintf("%d Mb/s", mbps)
	}
	vlan := func(c hw.VFConfig) string {
		if c.VLAN == 0 && c.QoS == 0 {
			return "none"
		}
		return fmt.Sprintf("%d (QoS %d)", c.VLAN, c.QoS)
	}
	type field struct{ name, now, was string }
	fields := []field{
		{"MAC", now.MAC, was.MAC},
		{"VLAN", vlan(now), vlan(was)},
		{"max tx rate", rate(now.MaxTxRateMbps), rate(was.MaxTxRateMbps)},
		{"min tx rate", rate(now.MinTxRateMbps), rate(was.MinTxRateMbps)},
		{"spoof check", onOff(now.SpoofChk), onOff(was.SpoofChk)},
		{"trust", onOff(now.Trust), onOff(was.Trust)},
		{"node GUID", now.NodeGUID, was.NodeGUID},
		{"port GUID", now.PortGUID, was.PortGUID},
	}
	if now.MTU != 0 && was.MTU != 0 {
		fields = append(fields, field{"MTU", fmt.Sprint(now.MTU), fmt.Sprint(was.MTU)})
	}
	var parts []string
	for _, f := range fields {
		if f.now != f.was {
			parts = append(parts, fmt.Sprintf("%s %s (was %s)", f.name, f.now, f.was))
		}
	}
	return strings.Join(parts, ", ")
}
