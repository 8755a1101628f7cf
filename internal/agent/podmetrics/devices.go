// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podmetrics

import (
	"maps"
	"slices"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	gpuprep "github.com/hwdra/hwdra/internal/agent/prepare/gpu"
	nicprep "github.com/hwdra/hwdra/internal/agent/prepare/nic"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// Device is one prepared device of a claim, as the checkpoint records
// it: what its series say.
type Device struct {
	Namespace, Claim string
	ClaimUID         types.UID
	Request          string
	Driver           string
	Pool, Name       string
	// Type is the published device's type (gpu, mig, share, vgpu,
	// passthrough; vf for a VF).
	Type string

	// GPUs. GPU is the physical GPU's PCI address, UUID its UUID (what
	// dcgm-exporter's UUID label says, for MIG devices too).
	GPU, UUID string
	// GPUInstance and ComputeInstance are a MIG device's (the GPU
	// instance also of a MIG-backed vGPU), Profile its MIG profile or
	// vGPU type, MIGUUID the MIG device's own UUID.
	GPUInstance, ComputeInstance *int
	Profile, MIGUUID             string
	// Sharing is how the device is shared: "" (not), SharingShare,
	// SharingMPS or SharingTimeSlicing; Share a share's limits.
	Sharing string
	Share   *gpuprep.ShareRecord

	// VFs: the VF's PCI address, its PF's netdev and its index there, and
	// the transmit rates set on it (Mb/s, 0: none).
	VF, PF               string
	VFIndex              int
	MaxTxRate, MinTxRate int
}

// How a GPU device is shared (Device.Sharing).
const (
	SharingShare       = "share"
	SharingMPS         = "mps"
	SharingTimeSlicing = "time-slicing"
)

// GPUDevices are the GPU driver's prepared claims' devices, sorted: the
// checkpoint's devices (adminAccess ones too, which the record leaves
// out), with what the record says of each.
func GPUDevices(claims map[types.UID]prepare.Claim[gpuprep.Record]) []Device {
	var out []Device
	for _, uid := range slices.Sorted(maps.Keys(claims)) {
		c := claims[uid]
		for _, d := range c.Devices {
			dev := Device{
				Namespace: c.Namespace, Claim: c.Name, ClaimUID: uid, Request: first(d.Requests),
				Driver: device.GPUDriver, Pool: d.Pool, Name: d.Device,
			}
			gpuAttributes(&dev, d.Attributes)
			for i := range c.Record.Devices {
				if r := &c.Record.Devices[i]; r.Device == d.Device && r.Request == dev.Request {
					gpuRecord(&dev, r)
					break
				}
			}
			out = append(out, dev)
		}
	}
	return out
}

// gpuAttributes reads a prepared GPU device's metadata: a MIG device's
// uuid is its own, its GPU's is parentUUID.
func gpuAttributes(dev *Device, attrs map[string]resourceapi.DeviceAttribute) {
	dev.Type = str(attrs[device.AttrType])
	dev.UUID = str(attrs[device.AttrUUID])
	if parent := str(attrs[device.GPUDriver+"/parentUUID"]); parent != "" {
		dev.MIGUUID, dev.UUID = dev.UUID, parent
		if dev.Type != device.KindMIG {
			dev.MIGUUID = "" // a vGPU's uuid is none of its own
		}
	}
	if p := str(attrs[device.AttrProfile]); p != device.ProfileFull && p != device.ProfileShare && p != device.ProfilePassthrough {
		dev.Profile = p
	}
	dev.GPUInstance = integer(attrs[metadata.AttrGPUInstanceID])
	dev.ComputeInstance = integer(attrs[metadata.AttrComputeInstanceID])
	dev.GPU = str(attrs[metadata.AttrParentPCIBusID])
	if dev.GPU == "" {
		dev.GPU = str(attrs[string(deviceattribute.StandardDeviceAttributePCIBusID)])
	}
}

// gpuRecord adds what the claim's record says of the device: its GPU
// and how it is shared.
func gpuRecord(dev *Device, r *gpuprep.DeviceRecord) {
	if r.GPU != "" {
		dev.GPU = r.GPU
	}
	s := r.Sharing
	switch {
	case s == nil:
	case s.Share != nil:
		dev.Sharing, dev.Share = SharingShare, s.Share
	case s.MPS != "":
		dev.Sharing = SharingMPS
	case s.TimeSlice != nil || s.ComputeMode != "":
		dev.Sharing = SharingTimeSlicing
	}
}

// NICDevices are the NIC driver's prepared claims' VFs, sorted.
func NICDevices(claims map[types.UID]prepare.Claim[nicprep.Record]) []Device {
	var out []Device
	for _, uid := range slices.Sorted(maps.Keys(claims)) {
		c := claims[uid]
		for _, vf := range c.Record.VFs {
			out = append(out, Device{
				Namespace: c.Namespace, Claim: c.Name, ClaimUID: uid, Request: vf.Request,
				Driver: device.NICDriver, Pool: vf.Pool, Name: vf.Device, Type: "vf",
				VF: vf.PCIAddress, PF: vf.PF, VFIndex: vf.Index,
				MaxTxRate: vf.Applied.MaxTxRateMbps, MinTxRate: vf.Applied.MinTxRateMbps,
			})
		}
	}
	return out
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

func str(a resourceapi.DeviceAttribute) string {
	if a.StringValue == nil {
		return ""
	}
	return *a.StringValue
}

func integer(a resourceapi.DeviceAttribute) *int {
	if a.IntValue == nil {
		return nil
	}
	v := int(*a.IntValue)
	return &v
}

// itoa writes an optional number; "" for none.
func itoa(v *int) string {
	if v == nil {
		return ""
	}
	return strconv.Itoa(*v)
}
