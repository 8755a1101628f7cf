// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nicsim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/nodefs"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/mock/profile"
)

func TestBuiltinNICProfiles(t *testing.T) {
	for _, name := range []string{"cx7", "dgx-a100", "dgx-h100", "dgx-h200"} {
		t.Run(name, func(t *testing.T) {
			h := build(t, name)
			if len(h.pfs) < 2 {
				t.Errorf("%d PFs, want at least 2", len(h.pfs))
			}
		})
	}
}

// testNICs are NICs built for a test, with their trees.
type testNICs struct {
	*NICs
	sysfs, dev string
}

// build builds the NICs of a built-in profile or a profile's YAML (given
// by its colon) in a directory removed with the test.
func build(t *testing.T, spec string) *testNICs {
	t.Helper()
	p, err := profile.ParseOrLoad(t.Name(), spec)
	if err != nil {
		t.Fatal(err)
	}
	h, err := buildProfile(t, p)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// buildProfile builds the NICs of a profile.
func buildProfile(t *testing.T, p profile.Profile) (*testNICs, error) {
	t.Helper()
	dir := t.TempDir()
	h := &testNICs{sysfs: filepath.Join(dir, "sys"), dev: filepath.Join(dir, "dev")}
	var err error
	if h.NICs, err = Build(p, h.sysfs, nodefs.NewDev(h.dev), false, persist.Discard); err != nil {
		return nil, err
	}
	t.Cleanup(func() { h.Close() })
	return h, nil
}

func TestNICTree(t *testing.T) {
	h := build(t, `nics: [{model: cx7, count: 2, vfs: 3, pciAddresses: ["0000:17:00.0", "0000:17:00.1"], defaultRoute: 1, linkUp: false}]`)
	read := func(p ...string) string {
		b, err := os.ReadFile(filepath.Join(append([]string{h.sysfs}, p...)...))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	link := func(p ...string) string {
		target, err := filepath.EvalSymlinks(filepath.Join(append([]string{h.sysfs}, p...)...))
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(h.sysfs, target)
		return rel
	}
	for _, c := range []struct{ got, want string }{
		{read("bus/pci/devices/0000:17:00.1/sriov_numvfs"), "3"},
		{read("bus/pci/devices/0000:17:00.1/sriov_vf_device"), "101e"},
		// Function 1's VFs come after function 0's sriov_totalvfs (127)
		// routing IDs: 0x1708 + 127 + 2 = 0x1789.
		{link("bus/pci/devices/0000:17:00.1/virtfn2"), "devices/pci0000:16/0000:16:01.0/0000:17:11.1"},
		{read("bus/pci/devices/0000:17:00.1/sriov_offset"), "134"},
		{link("bus/pci/devices/0000:17:11.1/physfn"), "devices/pci0000:16/0000:16:01.0/0000:17:00.1"},
		{link("bus/pci/devices/0000:17:11.1/driver"), "bus/pci/drivers/mlx5_core"},
		{link("class/net/enp23s0f1v2"), "devices/pci0000:16/0000:16:01.0/0000:17:11.1/net/enp23s0f1v2"},
		{link("class/net/enp23s0f1/device"), "devices/pci0000:16/0000:16:01.0/0000:17:00.1"},
		{read("class/net/enp23s0f1/operstate"), "down"},
		{read("class/net/enp23s0f1/speed"), "-1"},
		{link("class/infiniband/mlx5_1"), "devices/pci0000:16/0000:16:01.0/0000:17:00.1/mlx5_core.rdma.1/infiniband/mlx5_1"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if got, _ := h.DefaultRouteNetdevs(); !reflect.DeepEqual(got, []string{"enp23s0f1"}) {
		t.Errorf("default routes %v", got)
	}
	if m, err := h.EswitchMode("0000:17:00.0"); m != "legacy" || err != nil {
		t.Errorf("eswitch %q, %v", m, err)
	}
	if _, err := h.EswitchMode("0000:99:00.0"); !errors.Is(err, unix.ENODEV) {
		t.Errorf("eswitch of no device: %v", err)
	}
}

func TestNICAddressesNeverCollide(t *testing.T) {
	// Default addresses take free buses, also around explicit ones.
	h := build(t, `nics: [{model: e810, count: 2, vfs: 1}, {model: cx7, count: 1, pciAddresses: ["0000:30:00.0"]}]`)
	var got []string
	for _, pf := range h.pfs {
		got = append(got, pf.addr.String())
	}
	if want := []string{"0000:31:00.0", "0000:32:00.0", "0000:30:00.0"}; !reflect.DeepEqual(got, want) {
		t.Errorf("addresses %v, want %v", got, want)
	}
	_, err := buildProfile(t, profile.Profile{Name: "dup", NICs: []profile.NICGroup{
		{Model: "cx7", Count: 1, PCIAddresses: []string{"0000:40:00.0"}},
		{Model: "e810", Count: 1, PCIAddresses: []string{"0000:40:00.0"}},
	}})
	if err == nil || !strings.Contains(err.Error(), `nics[1]: PCI address "0000:40:00.0" of nics[1] PF 0 (0000:40:00.0) is also the PCI address of nics[0] PF 0 (0000:40:00.0)`) {
		t.Errorf("duplicate address across groups: %v", err)
	}
}

// TestNetdevNamesUnique: a netdev name taken twice, given or by default,
// PF or VF, is refused naming both owners, not as a sysfs error.
func TestNetdevNamesUnique(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"nics: [{model: cx7, count: 2, netdevs: [ab, ab]}]",
			`nics[0]: netdev "ab" of nics[0] PF 1 (0000:31:00.0) is also the netdev of nics[0] PF 0 (0000:30:00.0): netdev names must be unique`},
		{"nics: [{model: cx7, count: 1, netdevs: [enp49s0f0]}, {model: cx7, count: 2}]",
			`nics[1]: netdev "enp49s0f0" of nics[1] PF 0 (0000:31:00.0) is also the netdev of nics[0] PF 0 (0000:30:00.0)`},
		{"nics: [{model: cx7, count: 1, vfs: 2, netdevs: [a]}, {model: cx7, count: 1, netdevs: [av1]}]",
			`netdev "av1" of nics[1] PF 0 (0000:31:00.0) is also the netdev of VF 1 of nics[0] PF 0 (0000:30:00.0)`},
	} {
		p, err := profile.Parse("t", []byte(tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := buildProfile(t, p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\nwant %s", tc.yaml, err, tc.want)
		}
	}
}

// TestOutOfBuses: PFs without addresses beyond the free buses are
// refused with the limit.
func TestOutOfBuses(t *testing.T) {
	p, err := profile.Parse("t", []byte("nics: [{model: cx7, count: 300}]"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := buildProfile(t, p); err == nil || !strings.Contains(err.Error(), "nics[0]: count: no free PCI bus left for PF 208: PFs without pciAddresses get the buses 30 to ff") {
		t.Errorf("300 PFs: %v", err)
	}
}

func TestVFRecorder(t *testing.T) {
	h := build(t, `nics: [{model: cx7, count: 1, vfs: 2, netdevs: [pf0], speedMbps: 100000}, {model: e810, count: 1, vfs: 1, netdevs: [pf1], vfDriver: vfio-pci}]`)
	r := h.VFConfigurator()
	vf0 := hw.VFRef{PF: "pf0", Index: 0, Netdev: "pf0v0"}
	vfio := hw.VFRef{PF: "pf1", Index: 0}
	// Initial state: MAC unset; E810 VFs start with spoof checking on,
	// mlx5's with it off; a VF without netdev has no MTU or link state.
	if c, _ := r.GetVF(vf0); c.MAC != "00:00:00:00:00:00" || c.SpoofChk || c.MTU != 1500 || c.NetdevUp == nil || *c.NetdevUp {
		t.Errorf("CX7 VF at start: %+v", c)
	}
	if c, _ := r.GetVF(vfio); !c.SpoofChk || c.MTU != 0 || c.NetdevUp != nil {
		t.Errorf("E810 vfio VF at start: %+v", c)
	}
	up := true
	all := hw.VFConfig{MAC: "02:aa:00:00:00:01", VLAN: 100, QoS: 3, MaxTxRateMbps: 25000, Trust: true, MTU: 9000, NetdevUp: &up}
	for _, tc := range []struct {
		name string
		ref  hw.VFRef
		cfg  hw.VFConfig
		want error
	}{
		{"everything", vf0, all, nil},
		{"VLAN 4095", vf0, hw.VFConfig{VLAN: 4095}, unix.EINVAL},
		{"QoS 8", vf0, hw.VFConfig{QoS: 8}, unix.EINVAL},
		{"rate above link speed", vf0, hw.VFConfig{MaxTxRateMbps: 100001}, unix.EINVAL},
		{"min above max", vf0, hw.VFConfig{MinTxRateMbps: 2000, MaxTxRateMbps: 1000}, unix.EINVAL},
		{"negative rate", vf0, hw.VFConfig{MaxTxRateMbps: -1}, unix.EINVAL},
		{"multicast MAC", vf0, hw.VFConfig{MAC: "01:00:5e:00:00:01"}, unix.EINVAL},
		{"MTU above the model's", vf0, hw.VFConfig{MTU: 9979}, unix.EINVAL},
		{"VF past numvfs", hw.VFRef{PF: "pf0", Index: 2}, hw.VFConfig{}, unix.EINVAL},
		{"unknown PF", hw.VFRef{PF: "eth7"}, hw.VFConfig{}, unix.ENODEV},
		{"wrong netdev", hw.VFRef{PF: "pf0", Index: 1, Netdev: "pf0v0"}, hw.VFConfig{}, unix.ENODEV},
		{"vfio VF: rate at link speed and VLAN", vfio, hw.VFConfig{VLAN: 7, MaxTxRateMbps: 100000}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := r.SetVF(tc.ref, tc.cfg); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("SetVF: %v, want %v", err, tc.want)
			}
			if tc.name == "everything" {
				if got, err := r.GetVF(vf0); err != nil || !reflect.DeepEqual(got, all) {
					t.Errorf("GetVF = %+v, %v\nwant %+v", got, err, all)
				}
			}
		})
	}
	// SetVF applies every field in order: the refused MTU call applied its
	// zero VLAN, rate and trust first; MAC, MTU and link state were left.
	got, _ := r.GetVF(vf0)
	want := hw.VFConfig{MAC: "02:aa:00:00:00:01", MTU: 9000, NetdevUp: &up}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("GetVF = %+v\nwant %+v", got, want)
	}
	if n := len(r.Records()); n != 12 {
		t.Errorf("%d records, want 12", n)
	}
	if rec := r.Records()[1]; rec.Config.VLAN != 4095 || !errors.Is(rec.Err, unix.EINVAL) {
		t.Errorf("record 1: %+v", rec)
	}
	if c, _ := r.GetVF(vfio); c.VLAN != 7 || c.MaxTxRateMbps != 100000 || c.SpoofChk {
		t.Errorf("E810 VF: %+v", c)
	}
}

// TestVFRecorderStopsAtFirstError: like the hardware, a refused field
// leaves the fields before it applied, so callers must restore.
func TestVFRecorderStopsAtFirstError(t *testing.T) {
	h := build(t, `nics: [{model: cx7, count: 1, vfs: 1, netdevs: [pf0]}]`)
	r := h.VFConfigurator()
	ref := hw.VFRef{PF: "pf0", Index: 0}
	before, _ := r.GetVF(ref)
	err := r.SetVF(ref, hw.VFConfig{MAC: "02:00:00:00:00:09", VLAN: 5000, Trust: true})
	if !errors.Is(err, unix.EINVAL) || !strings.Contains(err.Error(), "setting VLAN") {
		t.Fatalf("SetVF: %v", err)
	}
	got, _ := r.GetVF(ref)
	if got.MAC != "02:00:00:00:00:09" || got.VLAN != 0 || got.Trust {
		t.Errorf("after a refused VLAN: %+v", got)
	}
	if err := r.SetVF(ref, before); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.GetVF(ref); !reflect.DeepEqual(got, before) {
		t.Errorf("restore: %+v, want %+v", got, before)
	}
}

// TestNICCharDevices: RDMA and VFIO nodes are published in sysfs (class
// dev files) and, as root, created under the dev root with those numbers.
func TestNICCharDevices(t *testing.T) {
	h := build(t, `nics: [{model: cx7, count: 1, vfs: 1, pciAddresses: ["0000:17:00.0"]},
                          {model: e810, count: 1, vfs: 1, pciAddresses: ["0000:31:00.0"], vfDriver: vfio-pci}]`)
	vfio := filepath.Join(h.sysfs, "bus/pci/devices/0000:31:00.0/virtfn0/iommu_group")
	group, err := os.Readlink(vfio)
	if err != nil {
		t.Fatal(err)
	}
	g := filepath.Base(group)
	gi, _ := strconv.Atoi(g)
	minor := uint32(gi - firstNICIOMMUGroup) // the second VF's group: 1
	for dev, want := range map[string]string{
		"class/infiniband_verbs/uverbs1/dev":   "231:193", // the VF's; uverbs0 is the PF's
		"class/infiniband_verbs/uverbs1/ibdev": "mlx5_1",
		"class/misc/rdma_cm/dev":               "10:58",
		"class/misc/vfio/dev":                  "10:196",
		"class/vfio/" + g + "/dev":             fmt.Sprintf("%d:%d", nodefs.VFIOMajor, minor),
	} {
		got, err := os.ReadFile(filepath.Join(h.sysfs, dev))
		if err != nil || strings.TrimSpace(string(got)) != want {
			t.Errorf("%s = %q, %v; want %s", dev, got, err, want)
		}
	}
	if !nodefs.CanMknod() {
		return
	}
	for node, want := range map[string][2]uint32{
		"infiniband/uverbs1": {231, 193}, "infiniband/rdma_cm": {10, 58}, "vfio/vfio": {10, 196}, "vfio/" + g: {nodefs.VFIOMajor, minor},
	} {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(h.dev, node), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR ||
			unix.Major(st.Rdev) != want[0] || unix.Minor(st.Rdev) != want[1] {
			t.Errorf("%s: %v, rdev %d:%d, want %v", node, err, unix.Major(st.Rdev), unix.Minor(st.Rdev), want)
		}
	}
}

// TestVFRecorderSwitchdevVLAN: mlx5 in switchdev mode takes VLAN 0 (what
// libvirt sets) but refuses a port VLAN with EOPNOTSUPP; legacy mode and
// E810 in switchdev mode accept it.
func TestVFRecorderSwitchdevVLAN(t *testing.T) {
	h := build(t, `nics: [{model: cx7, count: 1, vfs: 1, netdevs: [sw0], eswitchMode: switchdev},
                          {model: cx7, count: 1, vfs: 1, netdevs: [lg0]},
                          {model: e810, count: 1, vfs: 1, netdevs: [ice0], eswitchMode: switchdev}]`)
	r := h.VFConfigurator()
	for _, tc := range []struct {
		pf   string
		cfg  hw.VFConfig
		want error
	}{
		{"sw0", hw.VFConfig{VLAN: 100}, unix.EOPNOTSUPP},
		{"sw0", hw.VFConfig{VLAN: 0, MaxTxRateMbps: 1000}, nil},
		{"lg0", hw.VFConfig{VLAN: 100}, nil},
		{"ice0", hw.VFConfig{VLAN: 100}, nil},
	} {
		if err := r.SetVF(hw.VFRef{PF: tc.pf}, tc.cfg); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s %+v: %v, want %v", tc.pf, tc.cfg, err, tc.want)
		}
	}
}

// TestVFRecorderMinRate: VF minimum transmit rates as the drivers take
// them. mlx5 sets one (eswitch bandwidth share) unless its firmware lacks
// the capability (vfMinTxRate: false): EOPNOTSUPP. ice sets one unless DCB
// is on (vfMinTxRate: false): EOPNOTSUPP; and refuses with EINVAL one that
// makes its VFs' minimums add up beyond the link speed (100G here), which
// mlx5 does not check. A minimum above the maximum is EINVAL everywhere.
func TestVFRecorderMinRate(t *testing.T) {
	h := build(t, `nics: [{model: cx7, count: 1, vfs: 3, netdevs: [mlx0]},
                          {model: cx7, count: 1, vfs: 1, netdevs: [mlxnoqos0], vfMinTxRate: false},
                          {model: e810, count: 1, vfs: 3, netdevs: [ice0]},
                          {model: e810, count: 1, vfs: 1, netdevs: [icedcb0], vfMinTxRate: false}]`)
	r := h.VFConfigurator()
	for _, tc := range []struct {
		pf    string
		index int
		cfg   hw.VFConfig
		want  error
	}{
		{"mlx0", 0, hw.VFConfig{MinTxRateMbps: 300000, MaxTxRateMbps: 300000}, nil},
		{"mlx0", 1, hw.VFConfig{MinTxRateMbps: 300000, MaxTxRateMbps: 300000}, nil}, // mlx5: weights, no sum check
		{"mlx0", 2, hw.VFConfig{MinTxRateMbps: 2000, MaxTxRateMbps: 1000}, unix.EINVAL},
		{"mlxnoqos0", 0, hw.VFConfig{MinTxRateMbps: 1000, MaxTxRateMbps: 1000}, unix.EOPNOTSUPP},
		{"mlxnoqos0", 0, hw.VFConfig{MaxTxRateMbps: 1000}, nil},
		{"ice0", 0, hw.VFConfig{MinTxRateMbps: 60000, MaxTxRateMbps: 60000}, nil},
		{"ice0", 1, hw.VFConfig{MinTxRateMbps: 50000, MaxTxRateMbps: 50000}, unix.EINVAL}, // 110G of 100G
		{"ice0", 1, hw.VFConfig{MinTxRateMbps: 40000, MaxTxRateMbps: 40000}, nil},
		{"ice0", 0, hw.VFConfig{MinTxRateMbps: 60000, MaxTxRateMbps: 60000}, nil}, // its own minimum again
		{"ice0", 2, hw.VFConfig{MaxTxRateMbps: 10000}, nil},
		{"icedcb0", 0, hw.VFConfig{MinTxRateMbps: 1000, MaxTxRateMbps: 1000}, unix.EOPNOTSUPP},
		{"icedcb0", 0, hw.VFConfig{MaxTxRateMbps: 1000}, nil},
	} {
		if err := r.SetVF(hw.VFRef{PF: tc.pf, Index: tc.index}, tc.cfg); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s VF %d %+v: %v, want %v", tc.pf, tc.index, tc.cfg, err, tc.want)
		}
	}
	if got := r.Snapshot()["ice0/1"]; got.MinTxRateMbps != 40000 {
		t.Errorf("ice0 VF 1 after a refused and an accepted minimum: %+v", got)
	}
}

// TestVFRecorderFault: the fault hook is asked field by field, in order,
// and its error stops SetVF there; Snapshot shows what was applied.
func TestVFRecorderFault(t *testing.T) {
	h := build(t, `nics: [{model: cx7, count: 1, vfs: 2, netdevs: [pf0]}]`)
	r := h.VFConfigurator()
	var asked []string
	r.SetFault(func(ref hw.VFRef, field string) error {
		asked = append(asked, field)
		if field == "trust" {
			return unix.EIO
		}
		return nil
	})
	up := true
	err := r.SetVF(hw.VFRef{PF: "pf0", Index: 1, Netdev: "pf0v1"}, hw.VFConfig{MAC: "02:00:00:00:00:01", VLAN: 3, MaxTxRateMbps: 1000, SpoofChk: true, Trust: true, MTU: 9000, NetdevUp: &up})
	if !errors.Is(err, unix.EIO) || !strings.Contains(err.Error(), "setting trust") {
		t.Fatalf("SetVF: %v", err)
	}
	if want := []string{"MAC", "VLAN", "rate", "spoofchk", "trust"}; !reflect.DeepEqual(asked, want) {
		t.Errorf("asked %v, want %v", asked, want)
	}
	snap := r.Snapshot()
	if got := snap["pf0/1"]; got.MAC != "02:00:00:00:00:01" || got.VLAN != 3 || got.MaxTxRateMbps != 1000 || !got.SpoofChk || got.Trust || got.MTU != 1500 {
		t.Errorf("pf0/1 after a refused trust: %+v", got)
	}
	if got := snap["pf0/0"]; got.MAC != "00:00:00:00:00:00" || got.MTU != 1500 || got.NetdevUp == nil || *got.NetdevUp {
		t.Errorf("pf0/0 untouched: %+v", got)
	}
	r.SetFault(nil)
	if err := r.SetVF(hw.VFRef{PF: "pf0", Index: 1}, hw.VFConfig{Trust: true}); err != nil {
		t.Errorf("after SetFault(nil): %v", err)
	}
}
