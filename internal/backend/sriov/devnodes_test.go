// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov_test

import (
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/backend/sriov"
)

// TestVFDeviceNodes: the nodes prepare hands a container for a VF, read
// from the mock's sysfs tree: a ConnectX VF's own RDMA device and uverbs
// node, an E810 VF's VFIO group, and what a VF without either answers.
func TestVFDeviceNodes(t *testing.T) {
	h, opts := node(t, `
nics:
- {model: cx7, count: 1, vfs: 2, pciAddresses: ["0000:17:00.0"]}
- {model: e810, count: 1, vfs: 2, pciAddresses: ["0000:31:00.0"], vfDriver: vfio-pci}
- {model: e810, count: 1, vfs: 1, pciAddresses: ["0000:4b:00.0"]}
`)
	pfs, err := sriov.Discover(opts)
	if err != nil {
		t.Fatal(err)
	}
	cx7VF, e810VF, iavfVF := pfs[0].VFs[1], pfs[1].VFs[1], pfs[2].VFs[0]

	// The PF is mlx5_0; its VFs get mlx5_1 and mlx5_2 after all PFs.
	rdma, uverbs, err := sriov.Uverbs(h.Sysfs, cx7VF.PCIAddress)
	if err != nil || rdma != "mlx5_2" || uverbs == nil || *uverbs != (sriov.CharDevice{Path: "infiniband/uverbs2", Major: 231, Minor: 194}) {
		t.Errorf("Uverbs(cx7 VF 1) = %q, %+v, %v", rdma, uverbs, err)
	}
	if rdma, uverbs, err := sriov.Uverbs(h.Sysfs, iavfVF.PCIAddress); rdma != "" || uverbs != nil || err != nil {
		t.Errorf("Uverbs(iavf VF) = %q, %+v, %v: want no RDMA", rdma, uverbs, err)
	}
	remove(t, dev(h, cx7VF.PCIAddress, "mlx5_core.rdma.2", "infiniband_verbs"))
	if _, _, err := sriov.Uverbs(h.Sysfs, cx7VF.PCIAddress); err == nil || !strings.Contains(err.Error(), "ib_uverbs") {
		t.Errorf("RDMA device without uverbs: %v", err)
	}

	g, err := sriov.VFIOGroup(h.Sysfs, e810VF.PCIAddress)
	if err != nil || !strings.HasPrefix(g.Path, "vfio/") || g.Path == "vfio/vfio" || g.Major == 0 {
		t.Errorf("VFIOGroup(vfio-pci VF) = %+v, %v", g, err)
	}
	if _, err := sriov.VFIOGroup(h.Sysfs, iavfVF.PCIAddress); err == nil || !strings.Contains(err.Error(), "vfio-pci") {
		t.Errorf("VFIOGroup(iavf VF): %v, want an error", err)
	}
	if c, err := sriov.MiscDevice(h.Sysfs, "vfio", "vfio/vfio"); err != nil || c != (sriov.CharDevice{Path: "vfio/vfio", Major: 10, Minor: 196}) {
		t.Errorf("vfio container node %+v, %v", c, err)
	}
	if _, err := sriov.MiscDevice(h.Sysfs, "nope", "nope"); err == nil {
		t.Error("missing misc device: want an error")
	}

	for _, tc := range []struct {
		addr, driver, netdev string
	}{
		{cx7VF.PCIAddress, "mlx5_core", cx7VF.Netdev},
		{e810VF.PCIAddress, "vfio-pci", ""},
	} {
		drv, nd, err := sriov.FunctionState(h.Sysfs, tc.addr)
		if err != nil || drv != tc.driver || nd != tc.netdev {
			t.Errorf("FunctionState(%s) = %q %q %v, want %q %q", tc.addr, drv, nd, err, tc.driver, tc.netdev)
		}
	}
	if _, _, err := sriov.FunctionState(h.Sysfs, "0000:ee:00.0"); err == nil {
		t.Error("FunctionState of a missing function: want an error")
	}
}
