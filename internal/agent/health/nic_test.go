// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/hwdra/hwdra/internal/agent/podnet/nritest"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/waitfor"
)

const nicProfile = `nics: [{model: cx7, count: 2, vfs: 4, netdevs: [pfa, pfb], pciAddresses: ["0000:17:00.0", "0000:b1:00.0"]}]`

func openNICs(t *testing.T) (*backend.Node, hw.Inventory) {
	t.Helper()
	spec := filepath.Join(t.TempDir(), "nics.yaml")
	if err := os.WriteFile(spec, []byte(nicProfile), 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := backend.Open("mock:" + spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	inv, err := n.Inventory(context.Background())
	if err != nil || len(inv.PFs) != 2 {
		t.Fatalf("inventory %+v %v", inv, err)
	}
	return n, inv
}

func reasons(m map[string]hw.Fault) map[string]string {
	out := map[string]string{}
	for k, f := range m {
		out[k] = f.Reason
	}
	return out
}

// TestNICMonitorChecks: a check finds a link down (and back up), a PF
// netdev gone and a VF gone; the probe's findings count too.
func TestNICMonitorChecks(t *testing.T) {
	n, inv := openNICs(t)
	logger, _ := ktesting.NewTestContext(t)
	notified := 0
	m := NewNICMonitor(n.SysfsRoot, nil, time.Hour, func() { notified++ })
	m.Probed(inv) // learns the speeds: a notice
	notified = 0
	m.check(logger)
	if f := m.Faults(); !f.Empty() || notified != 0 {
		t.Fatalf("healthy NICs: %+v, %d notices", f, notified)
	}

	if err := n.Mock().SetLink("pfa", false); err != nil {
		t.Fatal(err)
	}
	m.check(logger)
	if got := reasons(m.Faults().PFs); len(got) != 1 || got["0000:17:00.0"] != "LinkDown" || notified != 1 {
		t.Fatalf("link down: %v, %d notices", got, notified)
	}
	if err := n.Mock().SetLink("0000:17:00.0", true); err != nil {
		t.Fatal(err)
	}
	m.check(logger)
	if f := m.Faults(); !f.Empty() || notified != 2 {
		t.Fatalf("link up again: %+v, %d notices", f, notified)
	}

	// The kernel drops a VF's PCI function and renames a PF's netdev.
	vf := inv.PFs[1].VFs[2].PCIAddress
	if err := os.Remove(filepath.Join(n.SysfsRoot, "bus", "pci", "devices", vf)); err != nil {
		t.Fatal(err)
	}
	net := filepath.Join(n.SysfsRoot, "bus", "pci", "devices", "0000:17:00.0", "net")
	if err := os.Rename(filepath.Join(net, "pfa"), filepath.Join(net, "renamed")); err != nil {
		t.Fatal(err)
	}
	m.check(logger)
	f := m.Faults()
	if got := reasons(f.PFs); len(got) != 1 || got["0000:17:00.0"] != "LinkRemoved" {
		t.Errorf("netdev gone: %v", got)
	}
	if got := reasons(f.VFs); len(got) != 1 || got[vf] != "VFGone" {
		t.Errorf("VF gone: %v", got)
	}

	// A probe that says a link is down is believed until a check says
	// otherwise.
	down := inv
	down.PFs = append([]hw.PF(nil), inv.PFs...)
	down.PFs[1].LinkUp, down.PFs[1].SpeedMbps = false, 0
	m.Probed(down)
	if got := reasons(m.Faults().PFs); got["0000:b1:00.0"] != "LinkDown" {
		t.Errorf("probe with pfb down: %v", got)
	}
}

// TestNICMonitorNetlink: as root, on veth stand-ins, a link going down is
// noticed through netlink, long before the periodic check.
func TestNICMonitorNetlink(t *testing.T) {
	nritest.HostNetns(t)
	n, inv := openNICs(t)
	notified := make(chan struct{}, 16)
	m := NewNICMonitor(n.SysfsRoot, &LinkSource{Netns: n.Mock().NICs().Netns()}, time.Hour, func() { notified <- struct{}{} })
	m.Probed(inv)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go m.Run(ctx)
	waitFor := func(what string, ok func(hw.Health) bool) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for !ok(m.Faults()) {
			select {
			case <-notified:
			case <-deadline:
				t.Fatalf("no %s within 5s: %+v", what, m.Faults())
			}
		}
	}
	// The first check has run: the watch is on.
	waitfor.True(t, "the NIC monitor's first check", 5*time.Second, func() bool { return !m.LastCheck().IsZero() })
	if err := n.Mock().SetLink("pfb", false); err != nil {
		t.Fatal(err)
	}
	waitFor("LinkDown fault", func(h hw.Health) bool { return h.PFs["0000:b1:00.0"].Reason == "LinkDown" })
	if err := n.Mock().SetLink("pfb", true); err != nil {
		t.Fatal(err)
	}
	waitFor("recovery", func(h hw.Health) bool { return h.Empty() })
}
