package nic

import (
	"errors"
	"io/fs"
	"path/filepath"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/hw"

	"github.com/hwdra/hwdra/slices/device"
	"github.com/hwdra/hwdra/sriov"
)

// Metadata attribute names of a prepared VF, besides the standard
// resource.kubernetes.io/pciBusID and the published ones (mode, pfName,
// pfPciAddress, vfIndex).
const (
	AttrBandwidth  resourceapi.QualifiedName = device.NICDriver + "/bandwidth" // a share's, "10G"
	AttrRDMADevice resourceapi.QualifiedName = device.NICDriver + "/rdmaDevice"
	AttrMAC        resourceapi.QualifiedName = device.NICDriver + "/mac"
	AttrVLAN       resourceapi.QualifiedName = device.NICDriver + "/vlan"
	AttrVLANQoS    resourceapi.QualifiedName = device.NICDriver + "/vlanQoS"
)

// describe returns what a container gets for a VF: CDI edits (the VF's
// PCI address in the environment, and the device nodes it needs: RDMA,
// vfio-pci) and the device's metadata. Every VF gets a CDI device, even a
// plain netdev with nothing but the variable: the claim's CDI spec is
// where its record survives a lost checkpoint.
func (d *Driver) describe(a Assignment, applied hw.VFConfig) (*cdispec.ContainerEdits, map[string]resourceapi.DeviceAttribute, error) {
	attrs := pfAttributes(a)
	attrs[string(deviceattribute.StandardDeviceAttributePCIBusID)] = str(a.VF.PCIAddress)
	attrs[string(device.NICAttrVFIndex)] = integer(int64(a.VF.Index))
	if a.Bandwidth != nil {
		attrs[string(AttrBandwidth)] = str(a.Bandwidth.String())
	}
	if applied.MAC != "" {
		attrs[string(AttrMAC)] = str(applied.MAC)
	}
	if applied.VLAN != 0 {
		attrs[string(AttrVLAN)] = integer(int64(applied.VLAN))
		attrs[string(AttrVLANQoS)] = integer(int64(applied.QoS))
	}

	var nodes []sriov.CharDevice
	env := []string{a.EnvPrefix + "PCI_ADDRESS=" + a.VF.PCIAddress}
	switch {
	case a.VF.Driver == "vfio-pci":
		// A userspace (DPDK, VM) driver opens the VFIO container and the
		// VF's group.
		container, err := sriov.MiscDevice(d.opts.SysfsRoot, "vfio", "vfio/vfio")
		if err != nil {
			return nil, nil, err
		}
		group, err := sriov.VFIOGroup(d.opts.SysfsRoot, a.VF.PCIAddress)
		if err != nil {
			return nil, nil, err
		}
		nodes = append(nodes, container, group)
	case a.VF.Netdev != "":
		// mlx5 gives each VF an RDMA device of its own; ice VFs (iavf)
		// have none (irdma serves the PF only).
		rdma, uverbs, err := sriov.Uverbs(d.opts.SysfsRoot, a.VF.PCIAddress)
		if err != nil {
			return nil, nil, err
		}
		if uverbs != nil {
			attrs[string(AttrRDMADevice)] = str(rdma)
			env = append(env, a.EnvPrefix+"RDMA_DEVICE="+rdma)
			nodes = append(nodes, *uverbs)
			// rdma_cm (connection manager) exists where rdma_ucm is loaded;
			// verbs work without it.
			if cm, err := sriov.MiscDevice(d.opts.SysfsRoot, "rdma_cm", "infiniband/rdma_cm"); err == nil {
				nodes = append(nodes, cm)
			} else if !errors.Is(err, fs.ErrNotExist) {
				return nil, nil, err
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
	return edits, attrs, nil
}

// pfAttributes are the metadata every device of the PF carries.
func pfAttributes(a Assignment) map[string]resourceapi.DeviceAttribute {
	attrs := make(map[string]resourceapi.DeviceAttribute, 12)
	attrs[string(device.NICAttrMode)] = str(string(a.Mode))
	attrs[string(device.NICAttrPFPCIAddress)] = str(a.PF.PCIAddress)
	if a.PF.Netdev != "" {
		attrs[string(device.NICAttrPFName)] = str(a.PF.Netdev)
	}
	return attrs
}

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

func integer(i int64) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{IntValue: &i} }
