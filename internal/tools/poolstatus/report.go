// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package poolstatus reports the state of a DRA driver's resource pools
// from the live ResourceSlices, ResourceClaims and DeviceTaintRules: per
// pool the counts the pool-status controller of kube-controller-manager
// reports (KEP-5677, resource.k8s.io/v1alpha3 ResourcePoolStatusRequest),
// computed by its definitions, so that the numbers exist on clusters
// without that alpha API; and what no upstream view says: per GPU and
// profile how many more instances fit beside the placements in use, and
// per shared device (an SR-IOV PF, a GPU's shares) the capacity its
// shares consume and what is left.
//
// Read lists the objects; Compute is pure; WriteTable renders.
package poolstatus

import (
	resourceapi "k8s.io/api/resource/v1"
	resourcealpha "k8s.io/api/resource/v1alpha3"
)

// Cluster is what a report is computed from.
type Cluster struct {
	Slices []resourceapi.ResourceSlice
	Claims []resourceapi.ResourceClaim
	// TaintRules are the cluster's DeviceTaintRules (none where that API
	// is off).
	TaintRules []resourceapi.DeviceTaintRule
}

// Report is the status of the selected pools, by driver and pool name.
type Report struct {
	Pools []Pool `json:"pools"`
}

// Pool is one pool: the controller's PoolStatus with its field names, and
// hwdra's own views of it. Counts and views are left out of an incomplete
// pool, as the controller leaves them out (validationError says why).
type Pool struct {
	resourcealpha.PoolStatus `json:",inline"`
	// GPUs: per GPU, per profile, what is published, allocated, and how
	// many more instances still fit.
	GPUs []GPU `json:"gpus,omitempty"`
	// SharedDevices: per device that claims share (allowMultipleAllocations),
	// its capacity consumed and left.
	SharedDevices []SharedDevice `json:"sharedDevices,omitempty"`
}

// GPU is one GPU's devices (every device carrying its PCI address).
type GPU struct {
	PCIBusID string    `json:"pciBusID"`
	Profiles []Profile `json:"profiles"`
}

// Profile is the devices of one profile (gpu.hwdra.io/profile) on a GPU.
type Profile struct {
	Profile string `json:"profile"`
	// Devices is how many instances of the profile the GPU publishes:
	// one device per placement for MIG and MIG-backed vGPU, a device
	// per block of instances (each share one) for time-sliced vGPU; for
	// a GPU's shares, how many of the request policy's default size its
	// one device holds.
	Devices int32 `json:"devices"`
	// Allocated are the instances allocated to claims (the shares of a
	// device that claims share).
	Allocated int32 `json:"allocated"`
	// Unavailable are the instances on devices tainted NoSchedule or
	// NoExecute (by the agent for a fault, or by a DeviceTaintRule).
	Unavailable int32 `json:"unavailable"`
	// Allocatable is how many more instances of the profile the scheduler
	// can still allocate on this GPU, given the placements, counters and
	// compatibility groups in use, leaving out tainted devices; for a
	// GPU's shares, how many more of the default size (the shared
	// devices' view says what capacity is left).
	Allocatable int32 `json:"allocatable"`
}

// SharedDevice is one device with allowMultipleAllocations.
type SharedDevice struct {
	Device string `json:"device"`
	// PFName and PCIAddress identify an SR-IOV PF (sriov.hwdra.io).
	PFName     string `json:"pfName,omitempty"`
	PCIAddress string `json:"pciAddress,omitempty"`
	// GPU is the PCI address of the GPU whose shares the device offers
	// (gpu.hwdra.io).
	GPU string `json:"gpu,omitempty"`
	// Allocations is the number of claim results on the device.
	Allocations int32 `json:"allocations"`
	// Unavailable: tainted, no new share lands here.
	Unavailable bool `json:"unavailable,omitempty"`
	// Held: the GPU's other devices (the whole GPU, a MIG partition, a
	// vGPU) are allocated and hold the counters the first share needs;
	// no share lands here until they go.
	Held bool `json:"held,omitempty"`
	// Capacity per capacity name: the device's, what its allocations
	// consume, and what is left.
	Capacity []resourcealpha.ShareableCapacityStatus `json:"capacity"`
}
