// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package device is the vocabulary of hwdra's published devices: the
// driver names, how devices are named, the attributes, capacities and
// taints that claims, constraints and other components refer to, and the
// cluster features a publication depends on. The builders (package
// slices/resources), prepare, health, metadata and pool status all read
// it; it holds no logic beyond naming.
package device

import resourceapi "k8s.io/api/resource/v1"

// Driver names.
const (
	GPUDriver = "gpu.hwdra.io"
	NICDriver = "sriov.hwdra.io"
)

// GPU attribute names (in the driver's domain unless standard).
const (
	// AttrProfile is what a device is: "full", a MIG profile ("1g.10gb")
	// or a vGPU type ("H100-10C").
	AttrProfile = GPUDriver + "/profile"
	// AttrType is "gpu", "mig", "vgpu" or "passthrough".
	AttrType = GPUDriver + "/type"
	// AttrPlacementStart and AttrPlacementSize are the memory slices a MIG
	// partition (or a MIG-backed vGPU's GPU instance) occupies.
	AttrPlacementStart = GPUDriver + "/placementStart"
	AttrPlacementSize  = GPUDriver + "/placementSize"
	// AttrUUID is a GPU's UUID; in a prepared MIG device's metadata, the
	// MIG device's own.
	AttrUUID = GPUDriver + "/uuid"
)

// GPUCapInstances is the capacity of a GPU device that claims share (a
// block of time-sliced vGPUs): how many shares it holds; each share takes
// one, and prepare makes one instance for it.
const GPUCapInstances resourceapi.QualifiedName = GPUDriver + "/instances"

// Device kinds, the values of AttrType.
const (
	KindGPU  = "gpu"
	KindMIG  = "mig"
	KindVGPU = "vgpu"
	// KindShare is a GPU's shareable device: independent claims each take
	// a share of its memory and compute, and run under the GPU's MPS
	// server held to them.
	KindShare = "share"
	// KindPassthrough is a whole GPU bound to vfio-pci, for a VM: NVML
	// does not see it, so it is never also a device of the other kinds.
	KindPassthrough = "passthrough"
)

// ProfileFull is AttrProfile of a whole GPU; ProfilePassthrough of a
// whole GPU bound to vfio-pci, kept apart so that a selector of whole GPUs
// for containers (profile "full") never picks one a container cannot use;
// ProfileShare of a GPU's shareable device.
const (
	ProfileFull        = "full"
	ProfilePassthrough = "passthrough"
	ProfileShare       = "share"
)

// GPU capacities a claim asks for: a GPU share's memory (bytes) and
// compute (percent of the GPU's multiprocessors), each with a request
// policy. What a share consumed is what its MPS client is held to.
const (
	GPUCapMemory  resourceapi.QualifiedName = GPUDriver + "/memory"
	GPUCapCompute resourceapi.QualifiedName = GPUDriver + "/compute"
)

// NIC attribute and capacity names, qualified with the driver name as the
// GPU ones are (CEL: device.attributes["sriov.hwdra.io"].pfName; constraints
// and capacity requests: "sriov.hwdra.io/pfName", "sriov.hwdra.io/bandwidth").
// A capacity request must use the qualified name: the allocator matches
// request keys to capacity names exactly. The standard ones (PCI address of
// an exclusive VF, NUMA node, PCIe root) keep their resource.kubernetes.io
// names so constraints match them across drivers: a GPU and a VF share on
// one NUMA node.
const (
	NICAttrMode         resourceapi.QualifiedName = NICDriver + "/mode" // "shared" or "exclusive"
	NICAttrPFName       resourceapi.QualifiedName = NICDriver + "/pfName"
	NICAttrPFPCIAddress resourceapi.QualifiedName = NICDriver + "/pfPciAddress"
	NICAttrVendorID     resourceapi.QualifiedName = NICDriver + "/vendorID" // "15b3"
	NICAttrDeviceID     resourceapi.QualifiedName = NICDriver + "/deviceID" // the PF's: "1021"
	NICAttrDriver       resourceapi.QualifiedName = NICDriver + "/driver"   // the PF's: "mlx5_core"
	NICAttrLinkType     resourceapi.QualifiedName = NICDriver + "/linkType" // "ethernet", "infiniband"
	NICAttrRDMA         resourceapi.QualifiedName = NICDriver + "/rdma"
	NICAttrEswitchMode  resourceapi.QualifiedName = NICDriver + "/eswitchMode"
	NICAttrVFIndex      resourceapi.QualifiedName = NICDriver + "/vfIndex"
	NICAttrVFDeviceID   resourceapi.QualifiedName = NICDriver + "/vfDeviceID"
	NICAttrVFDriver     resourceapi.QualifiedName = NICDriver + "/vfDriver" // "mlx5_core", "iavf", "vfio-pci"

	// NICCapBandwidth is the link speed in bits per second; on shared
	// devices each allocation consumes a share of it.
	NICCapBandwidth resourceapi.QualifiedName = NICDriver + "/bandwidth"
	// NICCapVFs is a shared PF's VF count; each allocation consumes one.
	NICCapVFs resourceapi.QualifiedName = NICDriver + "/vfs"
)

// Taint keys of unhealthy devices; the value is the fault's reason
// ("XID79", "LinkDown").
const (
	GPUTaintKey = GPUDriver + "/unhealthy"
	NICTaintKey = NICDriver + "/unhealthy"
)
