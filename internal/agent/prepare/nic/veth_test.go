// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/hwdra/hwdra/internal/agent/podnet/nritest"
)

// TestVethMTU: with veth stand-ins for the netdevs (in a throwaway
// network namespace standing in for the host's), the VF's MTU really
// changes on the link at prepare and is restored, with its link state, at
// unprepare.
func TestVethMTU(t *testing.T) {
	nritest.HostNetns(t)
	e := newEnv(t, cx7Node, "")
	nl := nritest.Handle(t, e.hw.NICs().Netns())
	link := func() netlink.Link {
		t.Helper()
		l, err := nl.LinkByName("pfav0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if l := link(); l.Attrs().MTU != 1500 || l.Attrs().Flags&net.FlagUp != 0 {
		t.Fatalf("VF 0 stand-in starts with MTU %d, flags %v", l.Attrs().MTU, l.Attrs().Flags)
	}
	c := e.allocate(newClaim(`, "mtu": 9000`, share("nic", "10G")))
	e.mustPrepare(c)
	if got := link().Attrs().MTU; got != 9000 {
		t.Errorf("MTU after prepare %d, want 9000", got)
	}
	if err := e.unprepare(c); err != nil {
		t.Fatal(err)
	}
	if l := link(); l.Attrs().MTU != 1500 || l.Attrs().Flags&net.FlagUp != 0 {
		t.Errorf("after unprepare: MTU %d, flags %v; want 1500, down", l.Attrs().MTU, l.Attrs().Flags)
	}
	e.checkPristine()
}
