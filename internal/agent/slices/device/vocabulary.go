// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package device

import (
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

// More GPU attributes: what a device's GPU is, and what a vGPU is.
const (
	// AttrParentUUID is a MIG partition's or vGPU's GPU's UUID.
	AttrParentUUID            = GPUDriver + "/parentUUID"
	AttrProductName           = GPUDriver + "/productName"
	AttrArchitecture          = GPUDriver + "/architecture"
	AttrCUDAComputeCapability = GPUDriver + "/cudaComputeCapability" // a version: "9.0.0"
	AttrDriverVersion         = GPUDriver + "/driverVersion"         // a version: "550.54.15"
	AttrCUDADriverVersion     = GPUDriver + "/cudaDriverVersion"     // a version: "12.4.0"
	AttrMIGCapable            = GPUDriver + "/migCapable"
	AttrPCIDeviceID           = GPUDriver + "/pciDeviceID" // "0x2330"
	AttrVGPUType              = GPUDriver + "/vgpuType"    // "H100-10C"
	AttrVGPUClass             = GPUDriver + "/vgpuClass"   // "Compute", "Quadro"
	AttrVGPUFramework         = GPUDriver + "/vgpuFramework"
	AttrMIGBacked             = GPUDriver + "/migBacked"
	// AttrMIGProfile is the MIG profile of a MIG-backed vGPU's GPU
	// instance.
	AttrMIGProfile = GPUDriver + "/migProfile"
)

// GPUCapMultiprocessors is a GPU's or MIG partition's streaming
// multiprocessors (GPUCapMemory its memory).
const GPUCapMultiprocessors resourceapi.QualifiedName = GPUDriver + "/multiprocessors"

// Counter names of a GPU's counter set (besides MemorySliceCounter and
// InstancesCounter).
const (
	// CounterMemory is the framebuffer that time-sliced vGPUs take.
	CounterMemory = "memory"
	// CounterVFs is the SR-IOV VFs that host vGPUs, one each, where they
	// can run out first.
	CounterVFs = "vfs"
	// CounterExclusive keeps the whole GPU and its shares apart where
	// nothing else does.
	CounterExclusive = "gpu"
)

const memorySlicePrefix = "memory-slice-"

// MemorySliceCounter is the counter of a GPU's MIG memory slice i.
func MemorySliceCounter(i int) string { return memorySlicePrefix + strconv.Itoa(i) }

// InstancesCounter is the counter of how many instances of a MIG profile
// a GPU may still make.
func InstancesCounter(profile string) string { return Name("instances", profile) }

// published is every attribute and capacity name hwdra publishes, with
// the standard ones it uses.
var published = map[resourceapi.QualifiedName]bool{
	AttrProfile: true, AttrType: true, AttrPlacementStart: true, AttrPlacementSize: true, AttrUUID: true,
	AttrParentUUID: true, AttrProductName: true, AttrArchitecture: true, AttrCUDAComputeCapability: true,
	AttrDriverVersion: true, AttrCUDADriverVersion: true, AttrMIGCapable: true, AttrPCIDeviceID: true,
	AttrVGPUType: true, AttrVGPUClass: true, AttrVGPUFramework: true, AttrMIGBacked: true, AttrMIGProfile: true,
	GPUCapInstances: true, GPUCapMemory: true, GPUCapCompute: true, GPUCapMultiprocessors: true,
	NICAttrMode: true, NICAttrPFName: true, NICAttrPFPCIAddress: true, NICAttrVendorID: true, NICAttrDeviceID: true,
	NICAttrDriver: true, NICAttrLinkType: true, NICAttrRDMA: true, NICAttrEswitchMode: true, NICAttrVFIndex: true,
	NICAttrVFDeviceID: true, NICAttrVFDriver: true, NICCapBandwidth: true, NICCapVFs: true,
	deviceattribute.StandardDeviceAttributePCIBusID: true, deviceattribute.StandardDeviceAttributePCIeRoot: true,
	deviceattribute.StandardDeviceAttributeNUMANode: true,
}

// Published reports whether name is one of the attribute or capacity
// names above: a test holds every name the builders emit to this list.
func Published(name resourceapi.QualifiedName) bool { return published[name] }

// Counter reports whether name is a counter name of the vocabulary.
func Counter(name string) bool {
	switch {
	case name == CounterMemory, name == CounterVFs, name == CounterExclusive:
		return true
	case strings.HasPrefix(name, memorySlicePrefix):
		_, err := strconv.Atoi(strings.TrimPrefix(name, memorySlicePrefix))
		return err == nil
	}
	return strings.HasPrefix(name, "instances-")
}
