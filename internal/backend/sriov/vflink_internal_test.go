// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestMatchVF: a VF's netdev is the link whose parent device is its PCI
// function; where the kernel reports no parent device, the link of the
// recorded ifindex with the recorded permanent MAC. A link's name never
// counts, and a veth (no parent, no permanent MAC) never matches.
func TestMatchVF(t *testing.T) {
	perm, _ := net.ParseMAC("02:00:17:00:00:01")
	vf := netlink.LinkAttrs{Name: "hidden0", Index: 7, ParentDev: "0000:17:01.1", ParentDevBus: "pci", PermHWAddr: perm}
	lookalike := netlink.LinkAttrs{Name: "net1", Index: 9, HardwareAddr: perm}
	other := netlink.LinkAttrs{Name: "eth0", Index: 2, ParentDev: "0000:17:01.2", ParentDevBus: "pci"}
	auxiliary := netlink.LinkAttrs{Name: "sf0", Index: 3, ParentDev: "0000:17:01.1", ParentDevBus: "auxiliary"}
	oldKernel := netlink.LinkAttrs{Name: "hidden0", Index: 7, PermHWAddr: perm}
	for _, tc := range []struct {
		name  string
		links []netlink.LinkAttrs
		id    LinkID
		want  string
	}{
		{"by its parent, renamed", []netlink.LinkAttrs{lookalike, other, vf}, LinkID{Parent: "0000:17:01.1", Index: 7}, "hidden0"},
		{"by its parent, nothing recorded", []netlink.LinkAttrs{lookalike, vf}, LinkID{}, "hidden0"},
		{"a lookalike of its name and MAC", []netlink.LinkAttrs{lookalike, other}, LinkID{Parent: "0000:17:01.1", Index: 7}, ""},
		{"another bus's device of the same name", []netlink.LinkAttrs{auxiliary}, LinkID{}, ""},
		{"a lookalike at the recorded ifindex", []netlink.LinkAttrs{{Name: "net1", Index: 7}}, LinkID{Index: 7, PermMAC: perm.String()}, ""},
		{"no parent device: ifindex and permanent MAC", []netlink.LinkAttrs{lookalike, oldKernel}, LinkID{Index: 7, PermMAC: "02:00:17:00:00:01"}, "hidden0"},
		{"no parent device: another permanent MAC", []netlink.LinkAttrs{oldKernel}, LinkID{Index: 7, PermMAC: "02:00:17:00:00:02"}, ""},
		{"no parent device, no permanent MAC recorded", []netlink.LinkAttrs{oldKernel}, LinkID{Index: 7}, ""},
		{"the parent was recorded: no fallback", []netlink.LinkAttrs{oldKernel}, LinkID{Parent: "0000:17:01.1", Index: 7, PermMAC: perm.String()}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			if i := matchVF(tc.links, "0000:17:01.1", tc.id); i >= 0 {
				got = tc.links[i].Name
			}
			if got != tc.want {
				t.Errorf("matched %q, want %q", got, tc.want)
			}
		})
	}
}
