// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
)

// invalidGIProfileID is NVML's INVALID_GPU_INSTANCE_PROFILE_ID, what
// VgpuTypeGetGpuInstanceProfileId answers for a time-sliced type.
const invalidGIProfileID = 0xFFFFFFFF

// vgpu reads the vGPU types of a GPU in host-vGPU mode. byDriverID maps
// the driver's GPU instance profile IDs, which MIG-backed types name, to
// GPU_INSTANCE_PROFILE_* indexes.
func (b *Backend) vgpu(ref gpuRef, dev nvml.Device, byDriverID map[uint32]int) (hw.VGPU, error) {
	var v hw.VGPU
	// Heterogeneous mode (mixed-size time-sliced vGPUs) came with R550 and
	// Hopper/Ada; elsewhere the call is missing or NOT_SUPPORTED: then every
	// time-sliced vGPU on a GPU must be of one type.
	if b.has("nvmlDeviceGetVgpuHeterogeneousMode") {
		mode, ret := dev.GetVgpuHeterogeneousMode()
		if ok, err := ref.optional("GetVgpuHeterogeneousMode", ret); err != nil {
			return hw.VGPU{}, err
		} else if ok {
			v.Heterogeneous = mode.Mode != 0
		}
	}
	types, ret := dev.GetSupportedVgpus()
	if ok, err := ref.optional("GetSupportedVgpus", ret); err != nil || !ok {
		return v, err
	}
	for _, t := range types {
		vt, err := b.vgpuType(ref, dev, t, byDriverID)
		if err != nil {
			return hw.VGPU{}, err
		}
		v.Types = append(v.Types, vt)
	}
	slices.SortFunc(v.Types, func(a, b hw.VGPUType) int { return int(a.ID) - int(b.ID) })
	return v, nil
}

func (b *Backend) vgpuType(ref gpuRef, dev nvml.Device, t nvml.VgpuTypeId, byDriverID map[uint32]int) (hw.VGPUType, error) {
	vt := hw.VGPUType{ID: uint(t.GetID())}
	call := func(what string, ret nvml.Return) error {
		return ref.err(fmt.Sprintf("vGPU type %d: %s", vt.ID, what), ret)
	}
	var ret nvml.Return
	if vt.Name, ret = t.GetName(); ret != nvml.SUCCESS {
		return vt, call("GetName", ret)
	}
	if vt.Class, ret = t.GetClass(); ret != nvml.SUCCESS {
		return vt, call("GetClass", ret)
	}
	if vt.FramebufferBytes, ret = t.GetFramebufferSize(); ret != nvml.SUCCESS {
		return vt, call("GetFramebufferSize", ret)
	}
	if vt.MaxInstances, ret = t.GetMaxInstances(dev); ret != nvml.SUCCESS {
		return vt, call("GetMaxInstances", ret)
	}
	if !b.has("nvmlVgpuTypeGetGpuInstanceProfileId") {
		return vt, nil // a driver without MIG-backed vGPU
	}
	id, ret := t.GetGpuInstanceProfileId()
	if ok, err := ref.optional(fmt.Sprintf("vGPU type %s: GetGpuInstanceProfileId", vt.Name), ret); err != nil || !ok {
		return vt, err
	}
	if id == invalidGIProfileID {
		return vt, nil // time-sliced
	}
	index, ok := byDriverID[id]
	if !ok {
		return vt, fmt.Errorf("GPU %d (%s): vGPU type %s is backed by GPU instance profile ID %d, which the GPU does not list",
			ref.index, ref.busID, vt.Name, id)
	}
	vt.GPUInstanceProfileID = &index
	return vt, nil
}

// vgpuFramework records how the node's driver creates the GPU's vGPUs and
// which of NVML's types it can create: NVML lists what the vGPU manager
// supports, whether or not a framework is set up to create it.
func (b *Backend) vgpuFramework(g *hw.GPU) error {
	fw, vfs, mdevTypes, err := Framework(b.sysfs, g.PCIBusID)
	if err != nil {
		return err
	}
	g.VGPU.Framework, g.VGPU.VFs = fw, vfs
	for i, t := range g.VGPU.Types {
		g.VGPU.Types[i].Creatable = fw == hw.VGPUFrameworkVFIO || fw == hw.VGPUFrameworkMdev && mdevTypes[t.ID]
	}
	return nil
}
