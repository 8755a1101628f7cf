// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package metadata

import (
	"net/netip"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// Attribute names of what exists only once a device is prepared, in the
// driver's domain like the published ones.
const (
	// GPUs, besides device.AttrUUID: a MIG device's own (a whole GPU's
	// is published).
	AttrGPUInstanceID     = device.GPUDriver + "/gpuInstanceID"
	AttrComputeInstanceID = device.GPUDriver + "/computeInstanceID"
	AttrMdevUUID          = device.GPUDriver + "/mdevUUID"
	// AttrVMMdevUUID is the mdev UUID again under the key KubeVirt's
	// virt-launcher reads, unqualified (KubeVirt VEP 10, "Required
	// Attributes": attributes["mdevUUID"], taking precedence over
	// resource.kubernetes.io/pciBusID). Unqualified means the driver's
	// domain, so both name the same attribute; the qualified one stays
	// for the readers written against earlier agents.
	AttrVMMdevUUID = "mdevUUID"
	AttrMdevParent = device.GPUDriver + "/mdevParent"
	// AttrParentPCIBusID is, for a vGPU of the vendor-specific VFIO
	// framework, the PCI address of its GPU: the metadata's
	// resource.kubernetes.io/pciBusID is the VF's, which the VM opens
	// (KubeVirt's virt-launcher reads that attribute from this metadata).
	AttrParentPCIBusID = device.GPUDriver + "/parentPciBusID"

	// A GPU share's limits as MPS holds it to them (docs/design.md,
	// "Metadata: attributes, never capacities"): the part of the GPU's
	// multiprocessors in percent (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and
	// the device memory in MiB, rounded down as MPS takes it
	// (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT). Not the capacities' names: the
	// metadata holds attributes only.
	AttrMPSThreadPercentage = device.GPUDriver + "/mpsActiveThreadPercentage"
	AttrMPSMemoryLimitMiB   = device.GPUDriver + "/mpsPinnedMemoryLimitMiB"

	// VFs, besides what the slice publishes, resource.kubernetes.io/pciBusID
	// (the VF's), vfIndex, vfDeviceID and vfDriver.
	//
	// A share's VF transmit rates as set, in Mb/s: the cap (max_tx_rate)
	// and the guaranteed minimum (min_tx_rate, 0 where the PF's driver
	// sets none). They are the share's bandwidth as the wire enforces it;
	// the bandwidth capacity itself is no attribute.
	AttrMaxTxRate  = device.NICDriver + "/maxTxRateMbps"
	AttrMinTxRate  = device.NICDriver + "/minTxRateMbps"
	AttrRDMADevice = device.NICDriver + "/rdmaDevice"
	AttrMAC        = device.NICDriver + "/mac"
	AttrVLAN       = device.NICDriver + "/vlan"
	AttrVLANQoS    = device.NICDriver + "/vlanQoS"
)

// GPU is a prepared GPU device (a whole GPU, a MIG partition or a vGPU)
// as its container reads it.
type GPU struct {
	// Published are the device's attributes in its ResourceSlice.
	Published map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	// UUID of a MIG device.
	UUID string
	// GPUInstance of a MIG device or a MIG-backed vGPU; ComputeInstance
	// of a MIG device.
	GPUInstance, ComputeInstance *int
	// MdevUUID and MdevParent are a vGPU's mediated device.
	MdevUUID, MdevParent string
	// VF is the PCI address of the VF a vGPU of the VFIO framework is.
	VF string
	// Share is a GPU share's limits; nil for any other device.
	Share *ShareLimits
}

// ShareLimits are what MPS holds a GPU share to.
type ShareLimits struct {
	// ThreadPercentage is the part of the GPU's multiprocessors, 1-100.
	ThreadPercentage int
	// MemoryBytes is the share's device memory; MPS takes it in whole MiB,
	// rounded down.
	MemoryBytes uint64
}

// MemoryMiB is the memory limit as MPS takes it: whole MiB, rounded
// down, at least 1 (mps.Spec.ClientEdits).
func (l ShareLimits) MemoryMiB() int { return int(max(l.MemoryBytes>>20, 1)) }

// Attributes are the device's immediate metadata: every attribute the
// ResourceSlice publishes for it, under the same names with the same
// values, plus what exists only once it is prepared. One exception: a
// vGPU of the VFIO framework is a VF, and its PCI address is the VF's
// (the GPU's moves to AttrParentPCIBusID), as a VM launcher needs it.
func (g GPU) Attributes() map[string]resourceapi.DeviceAttribute {
	out := make(map[string]resourceapi.DeviceAttribute, len(g.Published)+6)
	for k, v := range g.Published {
		out[string(k)] = v
	}
	setString(out, device.AttrUUID, g.UUID)
	setInt(out, AttrGPUInstanceID, g.GPUInstance)
	setInt(out, AttrComputeInstanceID, g.ComputeInstance)
	setString(out, AttrMdevUUID, g.MdevUUID)
	setString(out, AttrVMMdevUUID, g.MdevUUID)
	setString(out, AttrMdevParent, g.MdevParent)
	if sh := g.Share; sh != nil {
		mib := sh.MemoryMiB()
		setInt(out, AttrMPSThreadPercentage, &sh.ThreadPercentage)
		setInt(out, AttrMPSMemoryLimitMiB, &mib)
	}
	if g.VF != "" {
		if parent, ok := out[string(deviceattribute.StandardDeviceAttributePCIBusID)]; ok {
			out[AttrParentPCIBusID] = parent
		}
		setString(out, string(deviceattribute.StandardDeviceAttributePCIBusID), g.VF)
	}
	return out
}

// NIC is a prepared NIC device (a VF share of a PF, or an exclusive VF)
// as its container reads it.
type NIC struct {
	// Published are the device's attributes in its ResourceSlice (the
	// PF's NUMA node, PCIe root, link type, driver, IDs, RDMA, eswitch
	// mode): a workload pins itself to its VF's NUMA node from them.
	Published         map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	Mode              string // "shared" or "exclusive"
	PFAddress, PFName string
	// VF is the VF prepared for the claim; nil for an adminAccess
	// request, which gets the device as it is.
	VF *VF
}

// VF is the VF a NIC claim got, as configured.
type VF struct {
	PCIAddress string
	Index      int
	// DeviceID and Driver are the VF's PCI device ID and kernel driver,
	// published for an exclusive VF, known for a share's once it is chosen.
	DeviceID, Driver string
	// Rates are a share's VF transmit rates as set.
	Rates *TxRates
	MAC   string
	// VLAN and its QoS, where set (0: none).
	VLAN, VLANQoS int
	// RDMADevice is the VF's own RDMA device, where it has one.
	RDMADevice string
}

// TxRates are a VF's transmit rate limits in Mb/s (0: none).
type TxRates struct{ MinMbps, MaxMbps int }

// Attributes are the device's immediate metadata: every attribute the
// ResourceSlice publishes for it, under the same names with the same
// values, plus the VF it got and how it was configured. The interface
// the pod sees comes later (Network).
func (n NIC) Attributes() map[string]resourceapi.DeviceAttribute {
	out := make(map[string]resourceapi.DeviceAttribute, len(n.Published)+12)
	for k, v := range n.Published {
		out[string(k)] = v
	}
	setString(out, string(device.NICAttrMode), n.Mode)
	setString(out, string(device.NICAttrPFPCIAddress), n.PFAddress)
	setString(out, string(device.NICAttrPFName), n.PFName)
	vf := n.VF
	if vf == nil {
		return out
	}
	setString(out, string(deviceattribute.StandardDeviceAttributePCIBusID), vf.PCIAddress)
	setInt(out, string(device.NICAttrVFIndex), &vf.Index)
	setString(out, string(device.NICAttrVFDeviceID), vf.DeviceID)
	setString(out, string(device.NICAttrVFDriver), vf.Driver)
	if r := vf.Rates; r != nil {
		setInt(out, AttrMaxTxRate, &r.MaxMbps)
		setInt(out, AttrMinTxRate, &r.MinMbps)
	}
	setString(out, AttrMAC, vf.MAC)
	if vf.VLAN != 0 {
		setInt(out, AttrVLAN, &vf.VLAN)
		setInt(out, AttrVLANQoS, &vf.VLANQoS)
	}
	setString(out, AttrRDMADevice, vf.RDMADevice)
	return out
}

// Network is a VF's deferred metadata, and its claim status's networkData:
// the interface as the pod sees it, known once it is in the pod's network
// namespace. Addresses are in CIDR form.
func Network(iface string, addresses []netip.Prefix, mac string) *resourceapi.NetworkDeviceData {
	nd := &resourceapi.NetworkDeviceData{InterfaceName: iface, HardwareAddress: mac}
	for _, a := range addresses {
		nd.IPs = append(nd.IPs, a.String())
	}
	return nd
}

// setString sets a non-empty value.
func setString(attrs map[string]resourceapi.DeviceAttribute, name, v string) {
	if v != "" {
		attrs[name] = resourceapi.DeviceAttribute{StringValue: &v}
	}
}

// setInt sets a value that exists.
func setInt(attrs map[string]resourceapi.DeviceAttribute, name string, v *int) {
	if v != nil {
		i := int64(*v)
		attrs[name] = resourceapi.DeviceAttribute{IntValue: &i}
	}
}
