// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/hwdra/hwdra/internal/mock/model"
	"github.com/hwdra/hwdra/internal/mock/profile"
)

// invalidGIProfileID is NVML's INVALID_GPU_INSTANCE_PROFILE_ID: what
// VgpuTypeGetGpuInstanceProfileId answers for a time-sliced type.
const invalidGIProfileID = 0xFFFFFFFF

// timeSlicedShares are the fractions of the board that C-series
// time-sliced vGPU types come in (H100 80GB: 80C, 40C, 20C, 16C, 10C, 8C,
// 5C, 4C, as in NVIDIA's vGPU user guide).
var timeSlicedShares = []int{1, 2, 4, 5, 8, 10, 16, 20}

// defaultVGPUTypes are the model's vGPU types when a profile names none:
// time-sliced C-series types "NVIDIA H100-<GB>C" (max instances: how many
// fit the board) and one MIG-backed type per plain MIG profile,
// "NVIDIA H100-<slices>-<GB>C" (1g.10gb -> H100-1-10C, 3g.40gb ->
// H100-3-40C, 7g.80gb -> H100-7-80C), max instances the profile's
// instance count. A time-sliced type's framebuffer is its GB in GiB, but
// never more than its share of the board: the H200's 141 GB are 143771
// MiB, not 141 GiB, so H200-141C gets the whole board.
func defaultVGPUTypes(m *model.GPU) []profile.VGPUType {
	boardGB := int((m.Config.MemoryMB + 1023) / 1024)
	var out []profile.VGPUType
	for _, n := range timeSlicedShares {
		gb := boardGB / n
		if gb < 4 {
			break
		}
		out = append(out, profile.VGPUType{
			Name: fmt.Sprintf("NVIDIA %s-%dC", m.Short, gb), Class: "Compute",
			FramebufferMB: min(uint64(gb)*1024, m.Config.MemoryMB/uint64(n)), MaxInstances: n,
		})
	}
	for _, p := range m.Profiles {
		var slices, gb int
		if _, err := fmt.Sscanf(p.Name, "%dg.%dgb", &slices, &gb); err != nil || p.Name != model.SliceName(slices, gb) {
			continue // +me, -me, ... variants have no vGPU type of their own here
		}
		out = append(out, profile.VGPUType{
			Name: fmt.Sprintf("NVIDIA %s-%d-%dC", m.Short, slices, gb), Class: "Compute",
			FramebufferMB: p.MemMB, MaxInstances: p.Count, MIGProfile: p.Name,
		})
	}
	return out
}

// vgpuTypeID builds the nvml.VgpuTypeId of a type. The profile was
// validated: a MIGProfile names a profile of the model.
func (d *gpu) vgpuTypeID(id uint32, t profile.VGPUType) nvml.VgpuTypeId {
	class := t.Class
	if class == "" {
		class = "Compute"
	}
	giProfile := uint32(invalidGIProfileID)
	if t.MIGProfile != "" {
		p, _ := d.model.ProfileByName(t.MIGProfile)
		giProfile = p.ID
	}
	return &mock.VgpuTypeId{
		GetIDFunc:              func() uint32 { return id },
		GetNameFunc:            func() (string, nvml.Return) { return t.Name, nvml.SUCCESS },
		GetClassFunc:           func() (string, nvml.Return) { return class, nvml.SUCCESS },
		GetFramebufferSizeFunc: func() (uint64, nvml.Return) { return t.FramebufferMB << 20, nvml.SUCCESS },
		GetMaxInstancesFunc: func(nvml.Device) (int, nvml.Return) {
			return t.MaxInstances, nvml.SUCCESS
		},
		GetMaxInstancesPerVmFunc:    func() (int, nvml.Return) { return 1, nvml.SUCCESS },
		GetGpuInstanceProfileIdFunc: func() (uint32, nvml.Return) { return giProfile, nvml.SUCCESS },
	}
}

// installVGPU answers the vGPU queries. Outside host-vGPU mode they are
// ERROR_NOT_SUPPORTED, as without the vGPU manager. Heterogeneous mode
// exists on Hopper and later only (ERROR_NOT_SUPPORTED on Ampere).
// Creatable types: with MIG mode on, MIG-backed vGPUs are created on GPU
// instances, so the GPU itself offers none; with it off, the time-sliced
// types.
func (d *gpu) installVGPU() {
	sd := d.Device
	sd.GetSupportedVgpusFunc = func() ([]nvml.VgpuTypeId, nvml.Return) {
		if d.virt != nvml.GPU_VIRTUALIZATION_MODE_HOST_VGPU {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		return slices.Clone(d.vgpus), nvml.SUCCESS
	}
	sd.GetCreatableVgpusFunc = func() ([]nvml.VgpuTypeId, nvml.Return) {
		if d.virt != nvml.GPU_VIRTUALIZATION_MODE_HOST_VGPU {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		d.RLock()
		mig := d.migCurrent == nvml.DEVICE_MIG_ENABLE
		d.RUnlock()
		var out []nvml.VgpuTypeId
		for _, t := range d.vgpus {
			if gi, _ := t.GetGpuInstanceProfileId(); !mig && gi == invalidGIProfileID {
				out = append(out, t)
			}
		}
		return out, nvml.SUCCESS
	}
	sd.GetActiveVgpusFunc = d.activeVGPUs
	sd.GetVgpuHeterogeneousModeFunc = func() (nvml.VgpuHeterogeneousMode, nvml.Return) {
		if d.virt != nvml.GPU_VIRTUALIZATION_MODE_HOST_VGPU || !d.model.HopperOrLater() {
			return nvml.VgpuHeterogeneousMode{}, nvml.ERROR_NOT_SUPPORTED
		}
		mode := nvml.VgpuHeterogeneousMode{Version: nvml.STRUCT_VERSION(nvml.VgpuHeterogeneousMode{}, 1)}
		if d.heterogeneous {
			mode.Mode = 1
		}
		return mode, nvml.SUCCESS
	}
}
