// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nicsim

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// TestVFLinkFindsTheStandInByItsPeer: a VF's stand-in is found by the
// peer the mock keeps, in the host and in a pod's namespace, under any
// name; a lookalike named and addressed like it is not, and neither is
// the stand-in from another namespace.
func TestVFLinkFindsTheStandInByItsPeer(t *testing.T) {
	hostPath, host := hostNetns(t)
	h := build(t, `nics: [{model: cx7, count: 1, vfs: 2, pciAddresses: ["0000:17:00.0"], netdevs: [pfa]}]`)
	const vf0 = "0000:17:01.0"
	fd := func(path string) int {
		ns, err := netns.GetFromPath(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Close() })
		return int(ns)
	}
	find := func(path string) string {
		t.Helper()
		_, name, err := h.VFLink(fd(path), vf0)
		if err != nil {
			t.Fatal(err)
		}
		return name
	}
	if got := find(hostPath); got != "pfav0" {
		t.Fatalf("in the host: %q, want pfav0", got)
	}
	if _, name, err := h.VFLink(fd(hostPath), "0000:17:00.0"); err != nil || name != "" {
		t.Errorf("the PF as a VF: %q, %v", name, err)
	}
	podPath, remove, err := NewNetns("hwdra-t-pod-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = remove() })
	l, err := host.LinkByName("pfav0")
	if err != nil {
		t.Fatal(err)
	}
	if err := host.LinkSetNsFd(l, fd(podPath)); err != nil {
		t.Fatal(err)
	}
	pod := handleAt(t, podPath)
	moved, err := pod.LinkByName("pfav0")
	if err != nil {
		t.Fatal(err)
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.HardwareAddr = "pfav0", moved.Attrs().HardwareAddr
	if err := errors.Join(pod.LinkSetName(moved, "hidden0"), pod.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "lookalike"})); err != nil {
		t.Fatal(err)
	}
	if got := find(podPath); got != "hidden0" {
		t.Errorf("in the pod: %q, want hidden0 (the stand-in, renamed)", got)
	}
	if got := find(hostPath); got != "" {
		t.Errorf("in the host while in the pod: %q", got)
	}
	other, removeOther, err := NewNetns("hwdra-t-other-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = removeOther() })
	if got := find(other); got != "" {
		t.Errorf("in another namespace: %q", got)
	}
}
