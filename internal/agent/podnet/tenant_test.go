// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podnet

import (
	"errors"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/hwdra/hwdra/internal/agent/podnet/nritest"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// TestTenantLookalikeAtStop is the attack of issue 34, row 6: a pod with
// CAP_NET_ADMIN renames its VF and creates a veth under the VF's pod name
// (with the VF's MAC). At sandbox stop the agent finds the VF by its PCI
// function, never by name: the VF comes back to the host under its own
// name with its settings, the pod's veth stays in the pod, nothing of the
// pod reaches the host, and the placement is gone only with the VF back.
// (Matched by name, the veth was moved into the host under the VF's name
// and the record deleted, the VF left in the pod.)
func TestTenantLookalikeAtStop(t *testing.T) {
	e := newEnv(t, oneCX7)
	pristine := links(t, e.host)
	sb := e.newPod("a")
	c := e.claim("", []*api.PodSandbox{sb}, "nic")
	e.mustPrepare(c)
	vf := e.vfOf(c)
	prepared := links(t, e.host)
	if err := e.runPod(sb); err != nil {
		t.Fatal(err)
	}
	podPath := netnsPath(sb)
	mac := links(t, podPath)["net1"].MAC

	// The tenant, in its pod's namespace.
	tenant := handle(t, podPath)
	l, err := tenant.LinkByName("net1")
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(tenant.LinkSetDown(l), tenant.LinkSetName(l, "hidden0")); err != nil {
		t.Fatal(err)
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.HardwareAddr = "net1", mustMAC(t, mac)
	if err := tenant.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "lookalike"}); err != nil {
		t.Fatal(err)
	}

	e.stopPod(sb)
	if got := links(t, e.host); !reflect.DeepEqual(got, prepared) {
		t.Errorf("after StopPodSandbox the host has\n%+v\nwant the VF back as before the pod\n%+v", got, prepared)
	}
	if _, name, err := e.hw.NICs().VFLink(fdOf(t, e.host), vf.PCIAddress); err != nil || name != vf.Netdev {
		t.Errorf("the VF is on the host as %q (%v), want %s", name, err, vf.Netdev)
	}
	inPod := links(t, podPath)
	if names := slices.Sorted(mapKeys(inPod)); !slices.Equal(names, []string{"lookalike", "net1"}) {
		t.Errorf("the pod's namespace has %v, want only the pod's own veth pair", names)
	}
	if p := e.placements(); len(p) != 0 {
		t.Errorf("placements left: %v", p)
	}
	e.removePod(sb)
	if err := e.unprepare(c); err != nil {
		t.Fatal(err)
	}
	if got := links(t, e.host); !reflect.DeepEqual(got, pristine) {
		t.Errorf("after unprepare the host has\n%+v\nwant\n%+v", got, pristine)
	}
}

// TestTenantMovesItsVFOn: the pod moves its VF into a namespace of its
// own and leaves a lookalike under the VF's name. At stop the VF is in
// neither the pod's namespace nor the host: nothing is moved or
// configured, a Warning Event on the pod says so, the placement is kept,
// and the return is retried. Once that namespace is gone the kernel
// returns the VF, and unprepare gives it its name and settings back.
func TestTenantMovesItsVFOn(t *testing.T) {
	e := newEnv(t, oneCX7)
	pristine := links(t, e.host)
	sb := e.newPod("a")
	c := e.claim("", []*api.PodSandbox{sb}, "nic")
	e.mustPrepare(c)
	vf := e.vfOf(c)
	if err := e.runPod(sb); err != nil {
		t.Fatal(err)
	}
	podPath := netnsPath(sb)
	away, removeAway := nritest.NewPod(t, "tenant", "away")
	tenant := handle(t, podPath)
	l, err := tenant.LinkByName("net1")
	if err != nil {
		t.Fatal(err)
	}
	awayNS, err := netns.GetFromPath(netnsPath(away))
	if err != nil {
		t.Fatal(err)
	}
	err = tenant.LinkSetNsFd(l, int(awayNS))
	awayNS.Close() // the namespace lives while anything holds it
	if err != nil {
		t.Fatal(err)
	}
	la := netlink.NewLinkAttrs()
	la.Name = "net1"
	if err := tenant.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "lookalike"}); err != nil {
		t.Fatal(err)
	}
	host := links(t, e.host)

	err = e.rt.StopPodSandbox(e.ctx, sb)
	if err == nil || !strings.Contains(err.Error(), "neither in its pod's network namespace nor in the host") || !strings.Contains(err.Error(), vf.PCIAddress) {
		t.Errorf("StopPodSandbox: %v, want the VF reported missing", err)
	}
	if got := links(t, e.host); !reflect.DeepEqual(got, host) {
		t.Errorf("the host changed:\n%+v\nwas\n%+v", got, host)
	}
	if names := slices.Sorted(mapKeys(links(t, podPath))); !slices.Equal(names, []string{"lookalike", "net1"}) {
		t.Errorf("the pod's namespace has %v, want its veth pair untouched", names)
	}
	if p := e.placements(); !slices.Equal(p, []string{vf.PCIAddress}) {
		t.Errorf("placements %v, want the VF's kept", p)
	}
	if ev := e.recorded(); len(ev) == 0 || !strings.Contains(ev[0], "ns/a Warning "+ReasonVFMissing+": VF "+vf.PCIAddress) {
		t.Errorf("Events %v, want a Warning %s on pod ns/a", ev, ReasonVFMissing)
	}

	// The namespace that holds it goes: the kernel returns the VF (in
	// the background).
	if err := removeAway(); err != nil {
		t.Fatal(err)
	}
	waitfor.True(t, "the VF back on the host", 10*time.Second, func() bool {
		_, name, err := e.hw.NICs().VFLink(fdOf(t, e.host), vf.PCIAddress)
		return err == nil && name != ""
	})

	e.removePod(sb)
	if err := e.unprepare(c); err != nil {
		t.Fatal(err)
	}
	if got := links(t, e.host); !reflect.DeepEqual(got, pristine) {
		t.Errorf("after unprepare the host has\n%+v\nwant\n%+v", got, pristine)
	}
	if p := e.placements(); len(p) != 0 {
		t.Errorf("placements left: %v", p)
	}
}

// fdOf opens the namespace at path (closed when t ends).
func fdOf(t *testing.T, path string) int {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return int(ns)
}

func mustMAC(t *testing.T, s string) net.HardwareAddr {
	t.Helper()
	hw, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return hw
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
