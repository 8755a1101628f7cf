package mock

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/hw"
)

func TestVethStandIns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace with veth links")
	}
	t.Setenv(VethEnv, "1")
	h := nicHW(t, `nics: [{model: cx7, count: 1, vfs: 2, netdevs: [pfa], linkUp: false},
                          {model: e810, count: 1, vfs: 1, netdevs: [pfb]},
                          {model: e810, count: 1, vfs: 1, netdevs: [pfc], vfDriver: vfio-pci}]`)
	name := h.NICs().Netns()
	if name == "" {
		t.Fatal("no namespace with HWDRA_MOCK_VETH=1")
	}
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
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
	if mac := link("pfb").Attrs().HardwareAddr.String(); mac != pfMAC(h.NICs().pfs[1]) {
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
	if err := h.NICs().VFConfigurator().SetVF(hw.VFRef{PF: "pfa", Index: 1, Netdev: "pfav1"}, hw.VFConfig{MTU: 9000, NetdevUp: &up}); err != nil {
		t.Fatal(err)
	}
	if vf := link("pfav1"); vf.Attrs().Flags&net.FlagUp == 0 || vf.Attrs().MTU != 9000 {
		t.Errorf("pfav1 after SetVF: %v MTU %d", vf.Attrs().Flags, vf.Attrs().MTU)
	}

	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/run/netns", name)); !os.IsNotExist(err) {
		t.Errorf("namespace %s still there after Close: %v", name, err)
	}
}

func TestNoNICs(t *testing.T) {
	h, err := New(Profile{Name: "gpu-only", GPUs: []GPUGroup{{Model: "h100-80gb", Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.NICs().VFConfigurator().SetVF(hw.VFRef{PF: "eth0"}, hw.VFConfig{}); !errors.Is(err, unix.ENODEV) {
		t.Errorf("SetVF on a node without NICs: %v", err)
	}
	if routes, err := h.NICs().DefaultRouteNetdevs(); routes != nil || err != nil {
		t.Errorf("routes %v, %v", routes, err)
	}
}

func TestNoVethsByDefault(t *testing.T) {
	if h := nicHW(t, `nics: [{model: cx7, count: 1, vfs: 1}]`); h.NICs().Netns() != "" {
		t.Error("veths without opting in")
	}
}
