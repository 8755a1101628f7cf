// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
)

// node builds a mock node from a NIC profile and returns it with the
// discovery options that read it.
func node(t testing.TB, profile string) (*mock.Hardware, sriov.Options) {
	t.Helper()
	h := mocktest.Open(t, profile)
	return h, sriov.Options{SysfsRoot: h.Sysfs, Routes: h.NICs(), Eswitch: h.NICs()}
}

// dev is a path under a PCI device's directory in the fake tree.
func dev(h *mock.Hardware, addr string, elem ...string) string {
	return filepath.Join(append([]string{h.Sysfs, "bus", "pci", "devices", addr}, elem...)...)
}

const twoCX7 = `
nics:
- model: cx7
  count: 2
  vfs: 4
  numaNodes: [0, 1]
  pciAddresses: ["0000:17:00.0", "0000:b1:00.0"]
  pcieRoots: [pci0000:16, pci0000:b0]
`

func TestDiscoverCX7(t *testing.T) {
	_, opts := node(t, twoCX7)
	opts.SysfsRoot += "/" // a root spelled differently reads the same
	pfs, err := sriov.Discover(opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(pfs) != 2 {
		t.Fatalf("got %d PFs, want 2", len(pfs))
	}
	pf := pfs[1]
	pf.VFs = nil
	want := hw.PF{
		PCIAddress: "0000:b1:00.0", Netdev: "enp177s0f0", VendorID: "15b3", DeviceID: "1021",
		Driver: "mlx5_core", NUMANode: 1, PCIeRoot: "pci0000:b0", LinkType: hw.LinkEthernet,
		RDMADevice: "mlx5_1", MAC: "0c:42:a1:00:b1:00", MTU: 1500, LinkUp: true, SpeedMbps: 400000,
		EswitchMode: "legacy", TotalVFs: 127, NumVFs: 4,
	}
	if !reflect.DeepEqual(pf, want) {
		t.Errorf("PF:\n got %+v\nwant %+v", pf, want)
	}
	vfs := pfs[1].VFs
	if len(vfs) != 4 {
		t.Fatalf("got %d VFs, want 4", len(vfs))
	}
	wantVF := hw.VF{Index: 3, PCIAddress: "0000:b1:01.3", Netdev: "enp177s0f0v3", Driver: "mlx5_core",
		DeviceID: "101e"}
	if vfs[3] != wantVF {
		t.Errorf("VF 3:\n got %+v\nwant %+v", vfs[3], wantVF)
	}
	for i, vf := range vfs {
		if vf.Index != i {
			t.Errorf("VF %d has index %d: not sorted", i, vf.Index)
		}
	}
	if rdma, err := sriov.RDMADevice(opts.SysfsRoot, vfs[3].PCIAddress); rdma != "mlx5_9" || err != nil {
		t.Errorf("RDMA device of VF 3: %q, %v", rdma, err)
	}
	if rdma, err := sriov.RDMADevice(opts.SysfsRoot, "0000:99:00.0"); rdma != "" || err == nil {
		t.Errorf("RDMA device of no device: %q, %v", rdma, err)
	}
}

// TestDiscoverFaults: each odd state gives its expected result, reports
// what is wrong (naming device and file) and never panics.
func TestDiscoverFaults(t *testing.T) {
	one := func(extra string) string {
		return "nics:\n- model: cx7\n  count: 2\n  vfs: 4\n  pciAddresses: [\"0000:17:00.0\", \"0000:18:00.0\"]\n" + extra
	}
	tests := []struct {
		name    string
		profile string
		mutate  func(t *testing.T, h *mock.Hardware)
		check   func(t *testing.T, pfs []hw.PF)
		wantErr []string // substrings of the error; nil: no error
	}{{
		name:    "VFs bound to vfio-pci have no netdev",
		profile: one("  vfDriver: vfio-pci\n"),
		check: func(t *testing.T, pfs []hw.PF) {
			vf := pfs[0].VFs[2]
			if vf.Driver != "vfio-pci" || vf.Netdev != "" || vf.PCIAddress != "0000:17:01.2" {
				t.Errorf("VF: %+v", vf)
			}
		},
	}, {
		name:    "unbound VFs",
		profile: one("  vfDriver: none\n"),
		check: func(t *testing.T, pfs []hw.PF) {
			if vf := pfs[0].VFs[0]; vf.Driver != "" || vf.Netdev != "" {
				t.Errorf("VF: %+v", vf)
			}
		},
	}, {
		name:    "sriov_numvfs 0",
		profile: "nics:\n- model: e810\n  count: 1\n",
		check: func(t *testing.T, pfs []hw.PF) {
			if pfs[0].NumVFs != 0 || len(pfs[0].VFs) != 0 || pfs[0].TotalVFs != 128 || pfs[0].Driver != "ice" {
				t.Errorf("PF: %+v", pfs[0])
			}
		},
	}, {
		name:    "missing speed file",
		profile: one(""),
		mutate:  func(t *testing.T, h *mock.Hardware) { remove(t, dev(h, "0000:17:00.0", "net", "enp23s0f0", "speed")) },
		check: func(t *testing.T, pfs []hw.PF) {
			if !pfs[0].LinkUp || pfs[0].SpeedMbps != 0 || pfs[1].SpeedMbps != 400000 {
				t.Errorf("PFs: %+v / %+v", pfs[0], pfs[1])
			}
		},
	}, {
		name:    "link down",
		profile: one("  linkUp: false\n"),
		check: func(t *testing.T, pfs []hw.PF) {
			if pfs[0].LinkUp || pfs[0].SpeedMbps != 0 {
				t.Errorf("PF: %+v", pfs[0])
			}
		},
	}, {
		name:    "operstate unknown with carrier is up",
		profile: one(""),
		mutate: func(t *testing.T, h *mock.Hardware) {
			write(t, dev(h, "0000:17:00.0", "net", "enp23s0f0", "operstate"), "unknown")
		},
		check: func(t *testing.T, pfs []hw.PF) {
			if !pfs[0].LinkUp || pfs[0].SpeedMbps != 400000 {
				t.Errorf("PF: %+v", pfs[0])
			}
		},
	}, {
		name:    "speed -1 while up",
		profile: one(""),
		mutate: func(t *testing.T, h *mock.Hardware) {
			write(t, dev(h, "0000:18:00.0", "net", "enp24s0f0", "speed"), "-1")
		},
		check: func(t *testing.T, pfs []hw.PF) {
			if !pfs[1].LinkUp || pfs[1].SpeedMbps != 0 {
				t.Errorf("PF: %+v", pfs[1])
			}
		},
	}, {
		name:    "default route",
		profile: one("  defaultRoute: 1\n"),
		check: func(t *testing.T, pfs []hw.PF) {
			if pfs[0].DefaultRoute || !pfs[1].DefaultRoute {
				t.Errorf("default route: %v %v", pfs[0].DefaultRoute, pfs[1].DefaultRoute)
			}
		},
	}, {
		name:    "dangling virtfn link",
		profile: one(""),
		mutate: func(t *testing.T, h *mock.Hardware) {
			target, err := filepath.EvalSymlinks(dev(h, "0000:17:01.2"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(target); err != nil {
				t.Fatal(err)
			}
		},
		check: func(t *testing.T, pfs []hw.PF) {
			var idx []int
			for _, vf := range pfs[0].VFs {
				idx = append(idx, vf.Index)
			}
			if len(idx) != 3 || idx[2] != 3 || pfs[0].NumVFs != 4 || len(pfs[1].VFs) != 4 {
				t.Errorf("VF indexes %v, PF %+v", idx, pfs[0])
			}
		},
		wantErr: []string{"0000:17:00.0", "virtfn2", "dangling symlink"},
	}, {
		name:    "dangling driver link",
		profile: one(""),
		mutate: func(t *testing.T, h *mock.Hardware) {
			remove(t, filepath.Join(h.Sysfs, "bus", "pci", "drivers", "mlx5_core"))
		},
		// The PF's link is checked and reported; VF links are only read
		// (a syscall per VF saved: the kernel removes them on unbind).
		check: func(t *testing.T, pfs []hw.PF) {
			if len(pfs) != 2 || pfs[0].Driver != "" || pfs[0].VFs[0].Driver != "mlx5_core" || pfs[0].SpeedMbps != 400000 {
				t.Errorf("PF: %+v", pfs[0])
			}
		},
		wantErr: []string{"0000:17:00.0: driver: dangling symlink"},
	}, {
		name:    "garbage in sriov_numvfs leaves the PF out",
		profile: one(""),
		mutate:  func(t *testing.T, h *mock.Hardware) { write(t, dev(h, "0000:18:00.0", "sriov_numvfs"), "many") },
		check: func(t *testing.T, pfs []hw.PF) {
			if len(pfs) != 1 || pfs[0].PCIAddress != "0000:17:00.0" {
				t.Errorf("PFs: %+v", pfs)
			}
		},
		wantErr: []string{"sriov: 0000:18:00.0: sriov_numvfs: not an integer"},
	}, {
		name:    "missing vendor file leaves the PF out",
		profile: one(""),
		mutate:  func(t *testing.T, h *mock.Hardware) { remove(t, dev(h, "0000:17:00.0", "vendor")) },
		check: func(t *testing.T, pfs []hw.PF) {
			if len(pfs) != 1 || pfs[0].PCIAddress != "0000:18:00.0" {
				t.Errorf("PFs: %+v", pfs)
			}
		},
		wantErr: []string{"0000:17:00.0: vendor: no such file"},
	}, {
		name:    "unknown and missing numa_node",
		profile: one("  numaNodes: [-1, 1]\n"),
		mutate:  func(t *testing.T, h *mock.Hardware) { remove(t, dev(h, "0000:18:00.0", "numa_node")) },
		check: func(t *testing.T, pfs []hw.PF) {
			if pfs[0].NUMANode != hw.UnknownNUMANode || pfs[1].NUMANode != hw.UnknownNUMANode {
				t.Errorf("NUMA: %d %d", pfs[0].NUMANode, pfs[1].NUMANode)
			}
		},
	}, {
		name:    "RDMA device directly under the PCI device (kernels before 5.11)",
		profile: one(""),
		mutate: func(t *testing.T, h *mock.Hardware) {
			remove(t, dev(h, "0000:17:00.0", "mlx5_core.rdma.0"))
			mkdir(t, dev(h, "0000:17:00.0", "infiniband", "mlx5_99"))
		},
		check: func(t *testing.T, pfs []hw.PF) {
			if pfs[0].RDMADevice != "mlx5_99" || pfs[1].RDMADevice != "mlx5_1" {
				t.Errorf("RDMA: %q %q", pfs[0].RDMADevice, pfs[1].RDMADevice)
			}
		},
	}, {
		name:    "E810 without RDMA, no devlink",
		profile: "nics:\n- model: e810\n  count: 1\n  vfs: 2\n  eswitchMode: none\n",
		check: func(t *testing.T, pfs []hw.PF) {
			pf := pfs[0]
			if pf.RDMADevice != "" || pf.EswitchMode != "" || pf.SpeedMbps != 100000 || pf.VFs[1].Driver != "iavf" || pf.VFs[1].DeviceID != "1889" {
				t.Errorf("PF: %+v", pf)
			}
		},
	}, {
		name:    "switchdev: the uplink among the representors",
		profile: "nics:\n- model: cx7\n  count: 1\n  vfs: 3\n  eswitchMode: switchdev\n  netdevs: [eth9]\n",
		check: func(t *testing.T, pfs []hw.PF) {
			if pfs[0].Netdev != "eth9" || pfs[0].EswitchMode != "switchdev" {
				t.Errorf("PF: %+v", pfs[0])
			}
		},
	}, {
		name:    "InfiniBand",
		profile: "nics:\n- model: cx7\n  count: 1\n  vfs: 1\n  linkType: infiniband\n",
		check: func(t *testing.T, pfs []hw.PF) {
			if pfs[0].LinkType != hw.LinkInfiniBand || pfs[0].MTU != 4092 || !strings.HasPrefix(pfs[0].Netdev, "ibp") {
				t.Errorf("PF: %+v", pfs[0])
			}
		},
	}, {
		name:    "a GPU with sriov_totalvfs is not a NIC",
		profile: one(""),
		mutate: func(t *testing.T, h *mock.Hardware) {
			dir := filepath.Join(h.Sysfs, "devices", "pci0000:3a", "0000:3b:00.0")
			mkdir(t, dir)
			for f, v := range map[string]string{"class": "0x030200", "vendor": "0x10de", "device": "0x2330", "sriov_totalvfs": "32", "sriov_numvfs": "0"} {
				write(t, filepath.Join(dir, f), v)
			}
			if err := os.Symlink("../../../devices/pci0000:3a/0000:3b:00.0", dev(h, "0000:3b:00.0")); err != nil {
				t.Fatal(err)
			}
		},
		check: func(t *testing.T, pfs []hw.PF) {
			if len(pfs) != 2 {
				t.Errorf("got %d PFs, want the 2 NICs", len(pfs))
			}
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, opts := node(t, tc.profile)
			if tc.mutate != nil {
				tc.mutate(t, h)
			}
			pfs, err := sriov.Discover(opts)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != nil && err == nil:
				t.Fatalf("no error, want one with %q", tc.wantErr)
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
			if err != nil {
				var de *sriov.DeviceError
				if !errors.As(err, &de) {
					t.Errorf("error %v is not a *DeviceError", err)
				}
			}
			tc.check(t, pfs)
		})
	}
}

func TestDiscoverFatal(t *testing.T) {
	_, opts := node(t, twoCX7)
	opts.Routes = failingRoutes{}
	if pfs, err := sriov.Discover(opts); err == nil || pfs != nil || !strings.Contains(err.Error(), "default routes") {
		t.Errorf("routes failing: got %v, %v; want no PFs and an error", pfs, err)
	}
	if _, err := sriov.Discover(sriov.Options{SysfsRoot: t.TempDir(), Routes: failingRoutes{}}); err == nil {
		t.Error("no PCI bus: want an error")
	}
}

type failingRoutes struct{}

func (failingRoutes) DefaultRouteNetdevs() ([]string, error) { return nil, errors.New("netlink: boom") }

func remove(t *testing.T, path string) {
	t.Helper()
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
}
