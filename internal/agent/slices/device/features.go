// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package device

// Features are the DRA features of the cluster the slices are for. Where one
// is off the API server drops its fields, so the builders fall back to a
// model that needs only what is on instead of publishing devices the
// scheduler would misread.
type Features struct {
	// PartitionableDevices: shared counters (DRAPartitionableDevices).
	// Without it no partitions are offered: only whole GPUs and MIG
	// instances that already exist.
	PartitionableDevices bool
	// CompatibilityGroups (DRADeviceCompatibilityGroups). Without it the
	// scheduler could mix MIG and vGPU on one GPU, so no vGPU is offered.
	CompatibilityGroups bool
	// ConsumableCapacity (DRAConsumableCapacity): bandwidth-shared VFs.
	ConsumableCapacity bool
	// DeviceTaints (DRADeviceTaints): taints on unhealthy devices.
	DeviceTaints bool
}

// AllFeatures is the cluster hwdra is built for.
var AllFeatures = Features{
	PartitionableDevices: true,
	CompatibilityGroups:  true,
	ConsumableCapacity:   true,
	DeviceTaints:         true,
}
