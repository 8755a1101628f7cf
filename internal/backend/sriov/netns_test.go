// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov_test

import (
	"errors"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/agent/podnet/nritest"
	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/mock/nicsim"
)

// twoNetns opens two throwaway namespaces, "host" with a veth pair vf0
// (the VF stand-in, MTU 1500, down) and vf0p, and "pod" with a link named
// taken.
func twoNetns(t *testing.T) (host, pod *sriov.Netns) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces with veth links")
	}
	open := func(prefix string) *sriov.Netns {
		path, remove, err := nicsim.NewNetns(prefix)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := remove(); err != nil {
				t.Error(err)
			}
		})
		n, err := sriov.OpenNetns(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	host, pod = open("hwdra-t-host-"), open("hwdra-t-pod-")
	add := func(ns *sriov.Netns, name, peer string) {
		if err := nritest.Handle(t, ns.Path).LinkAdd(veth(name, peer)); err != nil {
			t.Fatal(err)
		}
	}
	add(host, "vf0", "vf0p")
	add(pod, "taken", "takenp")
	return host, pod
}

func TestMoveLinkIntoPodAndBack(t *testing.T) {
	for _, stepwise := range []bool{false, true} {
		name := "one request"
		if stepwise {
			name = "stepwise"
		}
		t.Run(name, func(t *testing.T) {
			host, pod := twoNetns(t)
			if stepwise {
				sriov.Stepwise(host)
				sriov.Stepwise(pod)
			}
			before, err := host.ReadLink("vf0")
			if err != nil {
				t.Fatal(err)
			}
			if err := host.RestoreLink("vf0", sriov.LinkState{Addresses: []string{"192.0.2.9/24"}}); err != nil {
				t.Fatal(err)
			}
			if before, err = host.ReadLink("vf0"); err != nil {
				t.Fatal(err)
			}
			if len(before.Addresses) != 1 {
				t.Fatalf("host address not set: %+v", before)
			}

			set := sriov.LinkSettings{Name: "net1", MTU: 9000, MAC: "02:aa:bb:cc:dd:01"}
			if err := host.MoveLink("vf0", pod, set); err != nil {
				t.Fatal(err)
			}
			addrs := []netip.Prefix{netip.MustParsePrefix("10.9.0.5/24"), netip.MustParsePrefix("fd00:9::5/64")}
			routes := []sriov.Route{
				{Destination: netip.MustParsePrefix("10.10.0.0/16"), Gateway: netip.MustParseAddr("10.9.0.1")},
				{Destination: netip.MustParsePrefix("10.11.0.0/16")},
			}
			for range 2 { // a second call changes nothing
				if err := pod.ConfigureLink("net1", addrs, true, routes); err != nil {
					t.Fatal(err)
				}
			}
			got, err := pod.ReadLink("net1")
			if err != nil {
				t.Fatal(err)
			}
			want := sriov.LinkState{Name: "net1", MTU: 9000, MAC: "02:aa:bb:cc:dd:01", Up: true, Addresses: []string{"10.9.0.5/24", "fd00:9::5/64"}}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("in the pod: %+v, want %+v", got, want)
			}
			if ok, _ := host.HasLink("vf0"); ok {
				t.Error("vf0 still in the host")
			}
			checkRoutes(t, pod.Path, "net1", []string{"10.10.0.0/16 via 10.9.0.1", "10.11.0.0/16"})

			back := sriov.LinkSettings{Name: before.Name, MTU: before.MTU, MAC: before.MAC}
			if err := pod.MoveLink("net1", host, back); err != nil {
				t.Fatal(err)
			}
			if err := host.RestoreLink("vf0", before); err != nil {
				t.Fatal(err)
			}
			if got, err := host.ReadLink("vf0"); err != nil || !reflect.DeepEqual(got, before) {
				t.Errorf("back in the host: %+v (%v), want %+v", got, err, before)
			}
		})
	}
}

// TestMoveLinkNameTaken: a name taken in the pod fails the move and leaves
// the link where it was, under its name.
func TestMoveLinkNameTaken(t *testing.T) {
	host, pod := twoNetns(t)
	err := host.MoveLink("vf0", pod, sriov.LinkSettings{Name: "taken"})
	if !errors.Is(err, unix.EEXIST) {
		t.Errorf("move onto a taken name: %v, want EEXIST", err)
	}
	if ok, _ := host.HasLink("vf0"); !ok {
		t.Error("vf0 left the host although the move failed")
	}
}

// TestMoveLinkRefusedSetting: the kernel moves first, then refuses the
// MTU; the link is in the pod under its old or new name, where the caller
// finds it to roll back.
func TestMoveLinkRefusedSetting(t *testing.T) {
	host, pod := twoNetns(t)
	err := host.MoveLink("vf0", pod, sriov.LinkSettings{Name: "net1", MTU: 70000})
	if err == nil {
		t.Fatal("MTU 70000 accepted on a veth")
	}
	if name, _ := pod.FindLink("net1", "vf0"); name == "" {
		t.Errorf("after a refused MTU the link is not in the pod: %v", err)
	}
}

func TestOpenNetnsGone(t *testing.T) {
	if _, err := sriov.OpenNetns("/run/netns/hwdra-no-such-namespace"); !errors.Is(err, sriov.ErrNetnsGone) {
		t.Errorf("OpenNetns of a missing file: %v, want ErrNetnsGone", err)
	}
}

func checkRoutes(t *testing.T, nsPath, link string, want []string) {
	t.Helper()
	h := nritest.Handle(t, nsPath)
	l, err := h.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	routes, err := h.RouteList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, r := range routes {
		s := r.Dst.String()
		if r.Gw != nil {
			s += " via " + r.Gw.String()
		}
		have[s] = true
	}
	for _, w := range want {
		if !have[w] {
			t.Errorf("no route %q on %s: %v", w, link, have)
		}
	}
}

// TestVFLinkIgnoresNames: in a namespace of veths, one named like the VF
// and with its MAC, no link is the VF: a veth has no parent device and no
// permanent MAC, whatever it is called. The link's identity as read says
// so too.
func TestVFLinkIgnoresNames(t *testing.T) {
	_, pod := twoNetns(t)
	la := netlink.NewLinkAttrs()
	la.Name, la.HardwareAddr = "net1", []byte{2, 0, 0x17, 0, 0, 1}
	if err := nritest.Handle(t, pod.Path).LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "net1p"}); err != nil {
		t.Fatal(err)
	}
	id, err := pod.LinkID("net1")
	if err != nil || id.Parent != "" || id.PermMAC != "" || id.Index == 0 {
		t.Fatalf("a veth's identity: %+v %v", id, err)
	}
	for _, rec := range []sriov.LinkID{{}, {Parent: "0000:17:01.0"}, id, {Index: id.Index, PermMAC: "02:00:17:00:00:01"}} {
		if index, name, err := pod.VFLink("0000:17:01.0", rec); err != nil || index != 0 || name != "" {
			t.Errorf("recorded %+v: found %q (ifindex %d), %v", rec, name, index, err)
		}
	}
}

// TestVFStatsOfALinkWithoutVFs: a link that is no PF (a veth, as the
// mock's stand-ins) lists no VF counters and no error; a missing PF is an
// error naming it.
func TestVFStatsOfALinkWithoutVFs(t *testing.T) {
	host, _ := twoNetns(t)
	stats, err := host.VFStats("vf0")
	if err != nil || len(stats) != 0 {
		t.Errorf("VFStats(vf0) = %v, %v; want none, no error", stats, err)
	}
	if _, err := host.VFStats("nosuchpf"); err == nil || !strings.Contains(err.Error(), "PF nosuchpf") {
		t.Errorf("VFStats(nosuchpf): %v, want an error naming the PF", err)
	}
}
