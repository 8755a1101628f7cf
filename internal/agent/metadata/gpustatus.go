// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package metadata

import (
	"encoding/json"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// GPUData is a prepared GPU device's data in its claim's status.devices:
// what a user reading the claim, or a monitoring tool joining the
// driver's metrics on UUIDs, needs. It says what the device's metadata
// says, so the container and the cluster see the same.
type GPUData struct {
	// UUID is the device's: the GPU's, a MIG device's own.
	UUID string `json:"uuid,omitempty"`
	// ParentUUID is the physical GPU's, for a MIG device.
	ParentUUID string `json:"parentUUID,omitempty"`
	// PCIBusID is the physical GPU's PCI address; VFPCIBusID the VF a
	// vGPU of the vendor-specific VFIO framework is.
	PCIBusID   string `json:"pciBusID,omitempty"`
	VFPCIBusID string `json:"vfPciBusID,omitempty"`
	// Type and Profile are as published (gpu.hwdra.io/type, /profile).
	Type    string `json:"type,omitempty"`
	Profile string `json:"profile,omitempty"`
	// GPUInstanceID and ComputeInstanceID are a MIG device's (a
	// MIG-backed vGPU's GPU instance).
	GPUInstanceID     *int64 `json:"gpuInstanceID,omitempty"`
	ComputeInstanceID *int64 `json:"computeInstanceID,omitempty"`
	// MdevUUID is a vGPU's mediated device.
	MdevUUID string `json:"mdevUUID,omitempty"`
	// Share is a GPU share's limits.
	Share *GPUShareData `json:"share,omitempty"`
	// MPSPipeDirectory is where the container finds its MPS control
	// daemon's pipe (its CUDA_MPS_PIPE_DIRECTORY), for devices under MPS.
	MPSPipeDirectory string `json:"mpsPipeDirectory,omitempty"`
}

// GPUShareData is what MPS holds a GPU share to.
type GPUShareData struct {
	// ActiveThreadPercentage is the part of the GPU's multiprocessors.
	ActiveThreadPercentage int64 `json:"activeThreadPercentage"`
	// PinnedMemoryLimitMiB is the device memory, in MiB as MPS takes it.
	PinnedMemoryLimitMiB int64 `json:"pinnedMemoryLimitMiB"`
	// Isolation is Policed (under the GPU's daemon of its policed shares)
	// or Dedicated (a daemon of its own).
	Isolation string `json:"isolation"`
}

// GPUStatus is a prepared GPU device's status.devices entry: Ready, with
// its data read from the device's metadata attributes.
func GPUStatus(pool, dev string, shareID *types.UID, attrs map[string]resourceapi.DeviceAttribute, share *GPUShareData, mpsPipe string) DeviceStatus {
	str := func(name string) string {
		if v := attrs[name].StringValue; v != nil {
			return *v
		}
		return ""
	}
	d := GPUData{
		UUID: str(device.AttrUUID), ParentUUID: str(device.AttrParentUUID), PCIBusID: str(string(deviceattribute.StandardDeviceAttributePCIBusID)),
		Type: str(device.AttrType), Profile: str(device.AttrProfile), GPUInstanceID: attrs[AttrGPUInstanceID].IntValue,
		ComputeInstanceID: attrs[AttrComputeInstanceID].IntValue, MdevUUID: str(AttrMdevUUID), Share: share, MPSPipeDirectory: mpsPipe,
	}
	if parent := str(AttrParentPCIBusID); parent != "" {
		d.PCIBusID, d.VFPCIBusID = parent, d.PCIBusID
	}
	data, err := json.Marshal(d)
	if err != nil {
		panic(err) // plain strings and numbers
	}
	msg := "prepared"
	if d.UUID != "" {
		msg = "prepared: " + d.UUID
	}
	return DeviceStatus{Pool: pool, Device: dev, ShareID: shareID, Data: data, Conditions: Prepared(), Message: msg}
}
