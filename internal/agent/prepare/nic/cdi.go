// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"errors"
	"io/fs"
	"path/filepath"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/hw"

	"github.com/hwdra/hwdra/internal/backend/sriov"
)

// describe returns what a container gets for a VF: CDI edits (the VF's
// PCI address in the environment, and the device nodes it needs: RDMA,
// vfio-pci) and the device's metadata. Every VF gets a CDI device, even a
// plain netdev with nothing but the variable: the claim's CDI spec is
// where its record survives a lost checkpoint.
func (d *Driver) describe(a Assignment, applied hw.VFConfig) (*cdispec.ContainerEdits, metadata.NIC, error) {
	md := nicMetadata(a)
	md.VF = &metadata.VF{PCIAddress: a.VF.PCIAddress, Index: a.VF.Index, DeviceID: a.VF.DeviceID, Driver: a.VF.Driver,
		MAC: applied.MAC, VLAN: applied.VLAN, VLANQoS: applied.QoS}
	if a.Bandwidth != nil && !a.KeepRate {
		md.VF.Rates = &metadata.TxRates{MinMbps: applied.MinTxRateMbps, MaxMbps: applied.MaxTxRateMbps}
	}

	var nodes []sriov.CharDevice
	env := []string{a.EnvPrefix + "PCI_ADDRESS=" + a.VF.PCIAddress}
	switch {
	case a.VF.Driver == "vfio-pci":
		// A userspace (DPDK, VM) driver opens the VFIO container and the
		// VF's group.
		container, err := sriov.MiscDevice(d.opts.SysfsRoot, "vfio", "vfio/vfio")
		if err != nil {
			return nil, md, err
		}
		group, err := sriov.VFIOGroup(d.opts.SysfsRoot, a.VF.PCIAddress)
		if err != nil {
			return nil, md, err
		}
		nodes = append(nodes, container, group)
	case a.VF.Netdev != "":
		// mlx5 gives each VF an RDMA device of its own; ice VFs (iavf)
		// have none (irdma serves the PF only).
		rdma, uverbs, err := sriov.Uverbs(d.opts.SysfsRoot, a.VF.PCIAddress)
		if err != nil {
			return nil, md, err
		}
		if uverbs != nil {
			md.VF.RDMADevice = rdma
			env = append(env, a.EnvPrefix+"RDMA_DEVICE="+rdma)
			nodes = append(nodes, *uverbs)
			// rdma_cm (connection manager) exists where rdma_ucm is loaded;
			// verbs work without it.
			if cm, err := sriov.MiscDevice(d.opts.SysfsRoot, "rdma_cm", "infiniband/rdma_cm"); err == nil {
				nodes = append(nodes, cm)
			} else if !errors.Is(err, fs.ErrNotExist) {
				return nil, md, err
			}
		}
	}
	edits := &cdispec.ContainerEdits{Env: env}
	for _, n := range nodes {
		edits.DeviceNodes = append(edits.DeviceNodes, &cdispec.DeviceNode{
			Path: "/dev/" + n.Path, HostPath: filepath.Join(d.opts.DevRoot, n.Path),
			Type: "c", Major: n.Major, Minor: n.Minor,
		})
	}
	return edits, md, nil
}

// nicMetadata is the metadata every device of the PF carries: what its
// slice publishes.
func nicMetadata(a Assignment) metadata.NIC {
	return metadata.NIC{Published: a.Published, Mode: string(a.Mode), PFAddress: a.PF.PCIAddress, PFName: a.PF.Netdev}
}
