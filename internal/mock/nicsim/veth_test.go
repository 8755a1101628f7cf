// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nicsim

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/nodefs"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/mock/profile"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// hostNetns makes a throwaway namespace standing in for the host's and
// points VethEnv at it.
func hostNetns(t *testing.T) (string, *netlink.Handle) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces with veth links")
	}
	path, remove, err := NewNetns("hwdra-t-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := remove(); err != nil {
			t.Error(err)
		}
	})
	t.Setenv(VethEnv, path)
	return path, handleAt(t, path)
}

func handleAt(t *testing.T, path string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nl.Close)
	return nl
}

func TestVethStandIns(t *testing.T) {
	path, nl := hostNetns(t)
	h := build(t, `nics: [{model: cx7, count: 1, vfs: 2, netdevs: [pfa], linkUp: false},
                          {model: e810, count: 1, vfs: 1, netdevs: [pfb]},
                          {model: e810, count: 1, vfs: 1, netdevs: [pfc], vfDriver: vfio-pci}]`)
	if got := h.Netns(); got != path {
		t.Fatalf("Netns() = %q, want %q", got, path)
	}
	link := func(n string) netlink.Link {
		t.Helper()
		l, err := nl.LinkByName(n)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		return l
	}
	// A PF with its link down has no carrier; one with it up does.
	if s := link("pfa").Attrs().OperState; s != netlink.OperLowerLayerDown {
		t.Errorf("pfa operstate %v, want lowerlayerdown", s)
	}
	if s := link("pfb").Attrs().OperState; s != netlink.OperUp {
		t.Errorf("pfb operstate %v, want up", s)
	}
	if mac := link("pfb").Attrs().HardwareAddr.String(); mac != pfMAC(h.pfs[1]) {
		t.Errorf("pfb MAC %s", mac)
	}
	vf := link("pfav1")
	if vf.Attrs().Flags&net.FlagUp != 0 || vf.Attrs().MTU != 1500 {
		t.Errorf("pfav1 starts %v MTU %d, want down 1500", vf.Attrs().Flags, vf.Attrs().MTU)
	}
	if _, err := nl.LinkByName("pfcv0"); err == nil {
		t.Error("a vfio-pci VF got a netdev")
	}
	// The recorder puts MTU and link state on the stand-in.
	up := true
	if err := h.VFConfigurator().SetVF(hw.VFRef{PF: "pfa", Index: 1, Netdev: "pfav1"}, hw.VFConfig{MTU: 9000, NetdevUp: &up}); err != nil {
		t.Fatal(err)
	}
	if vf := link("pfav1"); vf.Attrs().Flags&net.FlagUp == 0 || vf.Attrs().MTU != 9000 {
		t.Errorf("pfav1 after SetVF: %v MTU %d", vf.Attrs().Flags, vf.Attrs().MTU)
	}

	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"pfa", "pfav0", "hwp0", "hwp0v1", "pfb"} {
		if _, err := nl.LinkByName(n); err == nil {
			t.Errorf("%s still there after Close", n)
		}
	}
}

// TestVethFollowsTheAgent: the sysfs tree lists a VF netdev only while its
// stand-in is in the host namespace, under its current name; a stand-in
// destroyed with a pod's namespace comes back, as a VF would.
func TestVethFollowsTheAgent(t *testing.T) {
	_, host := hostNetns(t)
	h := build(t, `nics: [{model: cx7, count: 1, vfs: 2, netdevs: [pfa]}]`)
	podPath, removePod, err := NewNetns("hwdra-t-pod-")
	if err != nil {
		t.Fatal(err)
	}
	defer removePod()
	pod := handleAt(t, podPath)
	podNs, err := netns.GetFromPath(podPath)
	if err != nil {
		t.Fatal(err)
	}
	defer podNs.Close()
	vfDir := func(name string) string {
		return filepath.Join(h.sysfs, "bus", "pci", "devices", h.pfs[0].vfs[0].addr.String(), "net", name)
	}
	waitSysfs := func(name string, present bool) {
		t.Helper()
		waitfor.True(t, fmt.Sprintf("sysfs entries of VF netdev %s present=%v", name, present), 5*time.Second, func() bool {
			_, err := os.Stat(vfDir(name))
			_, cerr := os.Lstat(filepath.Join(h.sysfs, "class", "net", name))
			return (err == nil) == present && (cerr == nil) == present
		})
	}
	l, err := host.LinkByName("pfav0")
	if err != nil {
		t.Fatal(err)
	}
	if err := host.LinkSetNsFd(l, int(podNs)); err != nil {
		t.Fatal(err)
	}
	waitSysfs("pfav0", false)
	if _, err := h.VFConfigurator().GetVF(hw.VFRef{PF: "pfa", Index: 0, Netdev: "pfav0"}); !errors.Is(err, unix.ENODEV) {
		t.Errorf("GetVF by the name of a netdev that left: %v, want ENODEV", err)
	}

	// Renamed on the way back: sysfs shows the new name.
	pl, err := pod.LinkByName("pfav0")
	if err != nil {
		t.Fatal(err)
	}
	if err := pod.LinkSetName(pl, "renamed0"); err != nil {
		t.Fatal(err)
	}
	hostNs, err := netns.GetFromPath(h.Netns())
	if err != nil {
		t.Fatal(err)
	}
	defer hostNs.Close()
	if err := pod.LinkSetNsFd(pl, int(hostNs)); err != nil {
		t.Fatal(err)
	}
	waitSysfs("renamed0", true)
	if b, err := os.ReadFile(filepath.Join(vfDir("renamed0"), "mtu")); err != nil || string(b) != "1500\n" {
		t.Errorf("sysfs mtu of renamed0: %q %v", b, err)
	}

	// Into the pod again, and the pod's namespace is destroyed: the VF
	// comes back as dev<ifindex>, with its sysfs entry.
	rl, err := host.LinkByName("renamed0")
	if err != nil {
		t.Fatal(err)
	}
	if err := host.LinkSetNsFd(rl, int(podNs)); err != nil {
		t.Fatal(err)
	}
	waitSysfs("renamed0", false)
	podNs.Close()
	pod.Close()
	if err := removePod(); err != nil {
		t.Fatal(err)
	}
	want := returnedName(rl.Attrs().Index)
	waitSysfs(want, true)
	back, err := host.LinkByName(want)
	if err != nil {
		t.Fatalf("VF stand-in not recreated as %s: %v", want, err)
	}
	if back.Attrs().Flags&net.FlagUp != 0 {
		t.Errorf("recreated VF is up")
	}
	if _, err := h.VFConfigurator().GetVF(hw.VFRef{PF: "pfa", Index: 0, Netdev: want}); err != nil {
		t.Errorf("GetVF by the returned name: %v", err)
	}
}

// TestVethPersistent: a persistent node leaves its stand-ins at Close and
// the next one takes them over where they are, restoring the VFs' saved
// settings on them.
func TestVethPersistent(t *testing.T) {
	_, host := hostNetns(t)
	p, err := profile.Parse(t.Name(), []byte(`nics: [{model: cx7, count: 1, vfs: 1, netdevs: [pfa]}]`))
	if err != nil {
		t.Fatal(err)
	}
	open := func(persistent bool) *NICs {
		t.Helper()
		dir := t.TempDir()
		n, err := Build(p, filepath.Join(dir, "sys"), nodefs.NewDev(filepath.Join(dir, "dev")), persistent, persist.Discard)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return n
	}
	h := open(true)
	up := true
	if err := h.VFConfigurator().SetVF(hw.VFRef{PF: "pfa", Index: 0, Netdev: "pfav0"}, hw.VFConfig{MTU: 4000, NetdevUp: &up}); err != nil {
		t.Fatal(err)
	}
	before, err := host.LinkByName("pfav0")
	if err != nil {
		t.Fatal(err)
	}
	var saved persist.State
	h.Snapshot(&saved)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	h2 := open(true)
	if err := h2.Restore(saved); err != nil {
		t.Fatal(err)
	}
	after, err := host.LinkByName("pfav0")
	if err != nil {
		t.Fatal(err)
	}
	if after.Attrs().Index != before.Attrs().Index || after.Attrs().MTU != 4000 {
		t.Errorf("stand-in replaced or changed: ifindex %d -> %d, MTU %d", before.Attrs().Index, after.Attrs().Index, after.Attrs().MTU)
	}
	if cfg, err := h2.VFConfigurator().GetVF(hw.VFRef{PF: "pfa", Index: 0, Netdev: "pfav0"}); err != nil || cfg.MTU != 4000 {
		t.Errorf("restored VF: %+v %v", cfg, err)
	}
	// A plain node on the same names replaces them.
	if err := h2.Close(); err != nil {
		t.Fatal(err)
	}
	h3 := open(false)
	if l, err := host.LinkByName("pfav0"); err != nil || l.Attrs().MTU != 1500 {
		t.Errorf("a fresh node kept the persistent stand-in: %v", err)
	}
	if err := h3.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := host.LinkByName("pfav0"); err == nil {
		t.Error("pfav0 left after a plain node's Close")
	}
}

func TestNoNICs(t *testing.T) {
	h, err := buildProfile(t, profile.Profile{Name: "gpu-only", GPUs: []profile.GPUGroup{{Model: "h100-80gb", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.VFConfigurator().SetVF(hw.VFRef{PF: "eth0"}, hw.VFConfig{}); !errors.Is(err, unix.ENODEV) {
		t.Errorf("SetVF on a node without NICs: %v", err)
	}
	if routes, err := h.DefaultRouteNetdevs(); routes != nil || err != nil {
		t.Errorf("routes %v, %v", routes, err)
	}
}

func TestNoVethsByDefault(t *testing.T) {
	if h := build(t, `nics: [{model: cx7, count: 1, vfs: 1}]`); h.HasVeths() {
		t.Error("veths without opting in")
	}
}

// TestRDMARecorder: RDMA devices move only in exclusive mode and only
// from where they are.
func TestRDMARecorder(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want error
	}{{"", unix.EOPNOTSUPP}, {"exclusive", nil}} {
		h := build(t, `rdmaNetns: "`+tc.mode+`"
nics: [{model: cx7, count: 1, vfs: 1}]`)
		r := h.RDMA()
		if ex, _ := r.Exclusive(); ex != (tc.mode == "exclusive") {
			t.Errorf("mode %q: exclusive %v", tc.mode, ex)
		}
		if err := r.MoveRDMA("mlx5_1", "", "/pod"); !errors.Is(err, tc.want) {
			t.Errorf("mode %q: move VF RDMA device: %v, want %v", tc.mode, err, tc.want)
		}
		if tc.want != nil {
			continue
		}
		if err := r.MoveRDMA("mlx5_1", "", "/pod"); !errors.Is(err, unix.ENODEV) {
			t.Errorf("moving from where it is not: %v", err)
		}
		if err := r.MoveRDMA("mlx5_1", "/pod", ""); err != nil || r.Where("mlx5_1") != "" {
			t.Errorf("moving back: %v, at %q", err, r.Where("mlx5_1"))
		}
	}
}

// TestLinkDownOnVeths: as root, a link taken down is seen by the kernel:
// the PF's veth loses its carrier, and netlink subscribers get the news.
func TestLinkDownOnVeths(t *testing.T) {
	hostNetns(t)
	h := build(t, `nics: [{model: cx7, count: 1, vfs: 1, netdevs: [pfa]}]`)
	ns, err := netns.GetFromPath(h.Netns())
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	updates := make(chan netlink.LinkUpdate, 16)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{Namespace: &ns}); err != nil {
		t.Fatal(err)
	}
	waitCarrier := func(want bool) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case u := <-updates:
				if u.Attrs().Name == "pfa" && (u.Attrs().OperState == netlink.OperUp) == want {
					return
				}
			case <-deadline:
				t.Fatalf("no netlink update with pfa carrier %v", want)
			}
		}
	}
	if err := h.SetLink("pfa", false); err != nil {
		t.Fatal(err)
	}
	waitCarrier(false)
	if err := h.SetLink("pfa", true); err != nil {
		t.Fatal(err)
	}
	waitCarrier(true)
}
