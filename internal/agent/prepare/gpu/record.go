// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"slices"

	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/hw"
)

// Record is what a claim's prepare did to the hardware, kept in the
// checkpoint. Each side effect is recorded before it is attempted, as an
// intent precise enough for Unprepare to find and undo it after a crash,
// even when the intent was never carried out or its result (an ID) was
// never recorded.
type Record struct {
	Devices []DeviceRecord `json:"devices,omitempty"`
}

// DeviceRecord is one prepared device.
type DeviceRecord struct {
	Request string `json:"request"`
	// Device is the published device name.
	Device string `json:"device"`
	// GPU is the PCI bus ID of the physical GPU.
	GPU string `json:"gpu"`
	// MIGMode is set when prepare switched (or set out to switch) the
	// GPU's MIG mode to Enabled. The mode the GPU had before the agent
	// first switched it is in the ledger, GPU-wide: it is restored once no
	// prepared claim uses the GPU, whichever claim that is.
	MIGMode *MIGModeChange `json:"migMode,omitempty"`
	// GPUInstance is the MIG GPU instance the device uses (MIG devices and
	// MIG-backed vGPUs).
	GPUInstance *GPUInstanceRecord `json:"gpuInstance,omitempty"`
	// ComputeInstance is the MIG device's compute instance.
	ComputeInstance *ComputeInstanceRecord `json:"computeInstance,omitempty"`
	// Mdev is a vGPU's mediated device.
	Mdev *MdevRecord `json:"mdev,omitempty"`
	// Sharing is what prepare set up for the device to be shared.
	Sharing *SharingRecord `json:"sharing,omitempty"`
	// VF is a vGPU of the vendor-specific VFIO framework: the VF made one.
	VF *VFRecord `json:"vf,omitempty"`
}

// SharingRecord is what a device's sharing changed. The GPU's settings
// before the change are in the ledger (settings/<GPU>), GPU-wide.
type SharingRecord struct {
	// ComputeMode is the compute mode set on the GPU (a whole GPU under
	// time slicing or MPS).
	ComputeMode nvml.ComputeMode `json:"computeMode,omitempty"`
	// TimeSlice is the time slice set on the GPU (TimeSlicing).
	TimeSlice *int `json:"timeSlice,omitempty"`
	// MPS is the MPS control daemon the device runs under (MPS, GPU
	// shares).
	MPS string `json:"mps,omitempty"`
	// Share is a GPU share's limits, what the scheduler counted: the
	// policing of shares reads a prepared share's from here. Absent in
	// records of agents before dedicated shares (all their shares were
	// policed).
	Share *ShareRecord `json:"share,omitempty"`
}

// ShareRecord is what a GPU share was given.
type ShareRecord struct {
	// Memory is the share's device memory in bytes, Compute its part of
	// the GPU's multiprocessors in percent.
	Memory  uint64 `json:"memory"`
	Compute int    `json:"compute"`
	// Dedicated: the share runs under an MPS daemon of its own, whose
	// defaults are its limits; otherwise under the GPU's daemon of its
	// policed shares.
	Dedicated bool `json:"dedicated,omitempty"`
}

// MIGModeChange: prepare switched MIG mode to Enabled.
type MIGModeChange struct {
	Enabled bool `json:"enabled"`
}

// GPUInstanceRecord identifies a GPU instance by what the allocation
// fixed, its profile and placement: that is how Unprepare finds it, also
// when its ID was never learnt.
type GPUInstanceRecord struct {
	// Profile is the GPU_INSTANCE_PROFILE_* index (hw.MIGProfile.ID).
	Profile   int          `json:"profile"`
	Placement hw.Placement `json:"placement"`
	// Created: the agent creates (or created) it and destroys it at
	// unprepare. False: an instance that existed before (a static MIG
	// partition), used as it is and never destroyed.
	Created bool `json:"created"`
	// ID is set once known.
	ID *int `json:"id,omitempty"`
}

// ComputeInstanceRecord is a compute instance inside the GPU instance.
type ComputeInstanceRecord struct {
	GPUInstance int `json:"gpuInstance"`
	// Slices is the size asked for, 0 for the whole GPU instance.
	Slices int `json:"slices,omitempty"`
	// Created: the agent creates it. Existing lists the compute instances
	// that were there before, which are never destroyed: without an ID,
	// Unprepare destroys the others.
	Created  bool  `json:"created"`
	Existing []int `json:"existing,omitempty"`
	ID       *int  `json:"id,omitempty"`
}

// MdevRecord is a vGPU's mediated device. Its UUID is chosen before it is
// created, so the intent names it exactly.
type MdevRecord struct {
	UUID string `json:"uuid"`
	// Parent is the PCI function it is created on (the GPU or one of its
	// virtual functions); Type the vGPU type ID.
	Parent string `json:"parent"`
	Type   uint   `json:"type"`
}

// VFRecord is a VF made a vGPU of a type (its current_vgpu_type). The VF
// is chosen before the write, so the intent names it exactly; Unprepare
// writes 0 back only while the VF is still of this type.
type VFRecord struct {
	Address string `json:"address"`
	Type    uint   `json:"type"`
}

// clone deep-copies the record: the checkpoint keeps what save was given
// while prepare goes on changing its own copy.
func (r Record) clone() Record {
	out := Record{Devices: make([]DeviceRecord, len(r.Devices))}
	for i, d := range r.Devices {
		c := d
		c.MIGMode = clonePtr(d.MIGMode)
		if d.GPUInstance != nil {
			gi := *d.GPUInstance
			gi.ID = clonePtr(gi.ID)
			c.GPUInstance = &gi
		}
		if d.ComputeInstance != nil {
			ci := *d.ComputeInstance
			ci.ID = clonePtr(ci.ID)
			ci.Existing = slices.Clone(ci.Existing)
			c.ComputeInstance = &ci
		}
		c.Mdev = clonePtr(d.Mdev)
		if d.Sharing != nil {
			s := *d.Sharing
			s.TimeSlice = clonePtr(s.TimeSlice)
			s.Share = clonePtr(s.Share)
			c.Sharing = &s
		}
		c.VF = clonePtr(d.VF)
		out.Devices[i] = c
	}
	return out
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// gpus lists the records' GPUs, sorted and unique: the locks to take.
func (r Record) gpus() []string {
	var out []string
	for _, d := range r.Devices {
		out = append(out, d.GPU)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
