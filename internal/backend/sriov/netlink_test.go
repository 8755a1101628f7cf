// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov_test

import (
	"errors"
	"net"
	"os"
	"reflect"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/hw"
)

// inNewNetns runs f on a thread inside a fresh network namespace, where the
// package-level netlink calls of NetlinkRoutes and NetlinkVFConfigurator
// act, and switches back.
func inNewNetns(t *testing.T, f func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace with veth links")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			t.Fatalf("switching back: %v", err) // the thread stays locked and dies
		}
		ns.Close()
		orig.Close()
		runtime.UnlockOSThread()
	}()
	f()
}

func mustLink(t *testing.T, l netlink.Link) netlink.Link {
	t.Helper()
	if err := netlink.LinkAdd(l); err != nil {
		t.Fatalf("adding %s: %v", l.Attrs().Name, err)
	}
	got, err := netlink.LinkByName(l.Attrs().Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(got); err != nil {
		t.Fatal(err)
	}
	return got
}

func veth(name, peer string) *netlink.Veth {
	la := netlink.NewLinkAttrs()
	la.Name = name
	return &netlink.Veth{LinkAttrs: la, PeerName: peer}
}

func TestNetlinkRoutes(t *testing.T) {
	inNewNetns(t, func() {
		// br0 (port p0) carries the IPv4 default route, macvlan mv0 on m0
		// the IPv6 one; o0 has only a subnet route and p1 is p0's peer.
		p0 := mustLink(t, veth("p0", "p1"))
		br := mustLink(t, &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}})
		if err := netlink.LinkSetMaster(p0, br); err != nil {
			t.Fatal(err)
		}
		m0 := mustLink(t, veth("m0", "m1"))
		mv := mustLink(t, &netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: "mv0", ParentIndex: m0.Attrs().Index}, Mode: netlink.MACVLAN_MODE_BRIDGE})
		o0 := mustLink(t, veth("o0", "o1"))
		for l, cidr := range map[netlink.Link]string{br: "10.77.0.1/24", o0: "10.78.0.1/24", mv: "fd00:77::1/64"} {
			addr, _ := netlink.ParseAddr(cidr)
			addr.Flags = unix.IFA_F_NODAD
			if err := netlink.AddrAdd(l, addr); err != nil {
				t.Fatalf("address %s: %v", cidr, err)
			}
		}
		for _, r := range []netlink.Route{
			{LinkIndex: br.Attrs().Index, Gw: net.ParseIP("10.77.0.254")},
			{LinkIndex: mv.Attrs().Index, Gw: net.ParseIP("fd00:77::fe")},
			{LinkIndex: o0.Attrs().Index, Dst: mustCIDR(t, "10.200.0.0/16"), Gw: net.ParseIP("10.78.0.254")},
		} {
			if err := netlink.RouteAdd(&r); err != nil {
				t.Fatalf("route %v: %v", r, err)
			}
		}
		got, err := sriov.NetlinkRoutes{}.DefaultRouteNetdevs()
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"br0", "m0", "mv0", "p0"}; !reflect.DeepEqual(got, want) {
			t.Errorf("default-route netdevs = %v, want %v", got, want)
		}
	})
}

func mustCIDR(t *testing.T, s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestNetlinkVFConfigurator: the real configurator speaks netlink; a veth
// has no VFs, so reads fail with a clear error and writes with the
// kernel's EOPNOTSUPP, the reason the mock records instead.
func TestNetlinkVFConfigurator(t *testing.T) {
	inNewNetns(t, func() {
		mustLink(t, veth("pf0", "pf0p"))
		c := sriov.NetlinkVFConfigurator{}
		if _, err := c.GetVF(hw.VFRef{PF: "pf0", Index: 0}); err == nil {
			t.Error("GetVF on a veth: want an error")
		}
		err := c.SetVF(hw.VFRef{PF: "pf0", Index: 0}, hw.VFConfig{MAC: "02:00:00:00:00:01"})
		if !errors.Is(err, unix.EOPNOTSUPP) {
			t.Errorf("SetVF on a veth: %v, want EOPNOTSUPP", err)
		}
		if _, err := c.GetVF(hw.VFRef{PF: "nope", Index: 0}); err == nil {
			t.Error("GetVF on a missing PF: want an error")
		}
	})
}
