// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
)

// The side effects prepare needs: MIG instances created and destroyed,
// MIG mode switched. GPUs are named by PCI bus ID, profiles by their
// GPU_INSTANCE_PROFILE_* index (hw.MIGProfile.ID), never by the driver's
// profile ID. Errors name the GPU and the NVML call and wrap its Return.

var (
	// ErrNotFound is wrapped when a GPU, GPU instance, compute instance or
	// vGPU does not exist (any more).
	ErrNotFound = errors.New("not found")
	// ErrResetRequired is wrapped when MIG mode can change only with a GPU
	// reset, which the agent never does.
	ErrResetRequired = errors.New("MIG mode change needs a GPU reset")
	// ErrInUse is wrapped when MIG mode cannot change because instances
	// exist or processes run on the GPU.
	ErrInUse = errors.New("GPU in use")
)

// onGPU runs fn with the GPU's handle, under the Init gate. Handles are
// looked up on every call: a MIG mode change may re-create them.
func (b *Backend) onGPU(busID string, fn func(dev nvml.Device, ref gpuRef) error) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if err := b.ready(); err != nil {
		return err
	}
	ref := gpuRef{index: -1, busID: busID}
	dev, ret := b.lib.DeviceGetHandleByPciBusId(busID)
	if ret != nvml.SUCCESS {
		if ret == nvml.ERROR_NOT_FOUND {
			return fmt.Errorf("GPU %s: DeviceGetHandleByPciBusId: %w (%w)", busID, ret, ErrNotFound)
		}
		return fmt.Errorf("GPU %s: DeviceGetHandleByPciBusId: %w", busID, ret)
	}
	if i, ret := dev.GetIndex(); ret == nvml.SUCCESS {
		ref.index = i
	}
	return fn(dev, ref)
}

func (r gpuRef) String() string {
	if r.index < 0 {
		return "GPU " + r.busID
	}
	return fmt.Sprintf("GPU %d (%s)", r.index, r.busID)
}

// notFound is err for a call that answered ERROR_NOT_FOUND (or, for
// instance lookups, NOT_SUPPORTED: MIG mode is off, so none exists).
func (r gpuRef) notFound(call string, ret nvml.Return) error {
	return fmt.Errorf("%s: %s: %w (%w)", r, call, ret, ErrNotFound)
}

// Minor is the GPU's device minor (/dev/nvidia<minor>). Read it after a
// MIG mode change: NVML warns that switching may re-bind the GPU and so
// change its minor.
func (b *Backend) Minor(busID string) (int, error) {
	var minor int
	err := b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		var ret nvml.Return
		if minor, ret = dev.GetMinorNumber(); ret != nvml.SUCCESS {
			return ref.err("GetMinorNumber", ret)
		}
		return nil
	})
	return minor, err
}

// GPUInstances lists the GPU's existing GPU instances with their compute
// instances and MIG device UUIDs, sorted by placement; none while MIG mode
// is off.
func (b *Backend) GPUInstances(busID string) ([]hw.GPUInstance, error) {
	var out []hw.GPUInstance
	err := b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		current, _, ret := dev.GetMigMode()
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.SUCCESS && current != nvml.DEVICE_MIG_ENABLE {
			return nil
		}
		if ret != nvml.SUCCESS {
			return ref.err("GetMigMode", ret)
		}
		var m hw.MIG
		var infos []nvml.GpuInstanceProfileInfo
		for index := 0; index < nvml.GPU_INSTANCE_PROFILE_COUNT; index++ {
			info, ret := dev.GetGpuInstanceProfileInfo(index)
			if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
				continue
			}
			if ret != nvml.SUCCESS {
				return ref.err(fmt.Sprintf("GetGpuInstanceProfileInfo(%d)", index), ret)
			}
			m.Profiles = append(m.Profiles, hw.MIGProfile{ID: index, Name: fmt.Sprintf("profile %d", index)})
			infos = append(infos, info)
		}
		if err := b.instances(ref, dev, &m, infos); err != nil {
			return err
		}
		out = m.Instances
		return nil
	})
	return out, err
}

// CreateGPUInstance creates a GPU instance of a profile at a placement
// (nvmlDeviceCreateGpuInstanceWithPlacement) and returns its ID. The
// placement is in memory slices, as hw.MIGProfile.Placements lists them.
func (b *Backend) CreateGPUInstance(busID string, profile int, at hw.Placement) (int, error) {
	var id int
	err := b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		info, ret := dev.GetGpuInstanceProfileInfo(profile)
		if ret != nvml.SUCCESS {
			return ref.err(fmt.Sprintf("GetGpuInstanceProfileInfo(%d)", profile), ret)
		}
		pl := nvml.GpuInstancePlacement{Start: uint32(at.Start), Size: uint32(at.Size)}
		gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &pl)
		if ret != nvml.SUCCESS {
			return ref.err(fmt.Sprintf("CreateGpuInstanceWithPlacement(profile %d, placement %d+%d)", profile, at.Start, at.Size), ret)
		}
		giInfo, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return ref.err("GpuInstance.GetInfo", ret)
		}
		id = int(giInfo.Id)
		return nil
	})
	return id, err
}

// gpuInstance looks a GPU instance up by ID.
func gpuInstance(dev nvml.Device, ref gpuRef, id int) (nvml.GpuInstance, error) {
	gi, ret := dev.GetGpuInstanceById(id)
	switch ret {
	case nvml.SUCCESS:
		return gi, nil
	case nvml.ERROR_NOT_FOUND, nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
		return nil, ref.notFound(fmt.Sprintf("GetGpuInstanceById(%d)", id), ret)
	}
	return nil, ref.err(fmt.Sprintf("GetGpuInstanceById(%d)", id), ret)
}

// ciProfile is a compute-instance profile a GPU instance offers, with its
// COMPUTE_INSTANCE_PROFILE_* index.
type ciProfile struct {
	index int
	info  nvml.ComputeInstanceProfileInfo
}

// ciProfiles lists the compute-instance profiles a GPU instance offers,
// smallest first; what names the GPU instance in errors.
func ciProfiles(gi nvml.GpuInstance, ref gpuRef, what string) ([]ciProfile, error) {
	var out []ciProfile
	for index := 0; index < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; index++ {
		// Hardware quirk: only the shared engine profile exists; NVML
		// answers NOT_SUPPORTED for the rest.
		info, ret := gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, ref.err(fmt.Sprintf("%s: GetComputeInstanceProfileInfo(%d)", what, index), ret)
		}
		out = append(out, ciProfile{index, info})
	}
	slices.SortStableFunc(out, func(a, b ciProfile) int { return int(a.info.SliceCount) - int(b.info.SliceCount) })
	return out, nil
}

// CreateComputeInstance creates a compute instance of the given size in
// compute slices inside a GPU instance, 0 meaning the whole GPU instance,
// and returns its ID. A size the GPU instance does not offer is an error
// listing the sizes it does.
func (b *Backend) CreateComputeInstance(busID string, gi, computeSlices int) (int, error) {
	var id int
	err := b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		g, err := gpuInstance(dev, ref, gi)
		if err != nil {
			return err
		}
		profiles, err := ciProfiles(g, ref, fmt.Sprintf("GPU instance %d", gi))
		if err != nil {
			return err
		}
		if len(profiles) == 0 {
			return fmt.Errorf("%s: GPU instance %d offers no compute instance profile", ref, gi)
		}
		info := profiles[len(profiles)-1].info // the whole GPU instance
		if computeSlices != 0 {
			i := slices.IndexFunc(profiles, func(p ciProfile) bool { return int(p.info.SliceCount) == computeSlices })
			if i < 0 {
				var sizes []int
				for _, p := range profiles {
					sizes = append(sizes, int(p.info.SliceCount))
				}
				return fmt.Errorf("%s: GPU instance %d has no compute instance of %d slices (it offers %v)", ref, gi, computeSlices, sizes)
			}
			info = profiles[i].info
		}
		ci, ret := g.CreateComputeInstance(&info)
		if ret != nvml.SUCCESS {
			return ref.err(fmt.Sprintf("GPU instance %d: CreateComputeInstance(%d slices)", gi, info.SliceCount), ret)
		}
		ciInfo, ret := ci.GetInfo()
		if ret != nvml.SUCCESS {
			return ref.err("ComputeInstance.GetInfo", ret)
		}
		id = int(ciInfo.Id)
		return nil
	})
	return id, err
}

// MIGDeviceUUID is the UUID ("MIG-...") of the MIG device that a compute
// instance of a GPU instance forms.
func (b *Backend) MIGDeviceUUID(busID string, gi, ci int) (string, error) {
	var out string
	err := b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		devs, ret := migDevices(dev)
		if ret != nvml.SUCCESS {
			return ref.err("GetMaxMigDeviceCount", ret)
		}
		for at, md := range devs {
			if at != (migAt{gi, ci}) {
				continue
			}
			if out, ret = md.GetUUID(); ret != nvml.SUCCESS {
				return ref.err(fmt.Sprintf("MIG device %d/%d: GetUUID", gi, ci), ret)
			}
			return nil
		}
		return fmt.Errorf("%s: no MIG device for GPU instance %d, compute instance %d: %w", ref, gi, ci, ErrNotFound)
	})
	return out, err
}

// DestroyComputeInstance destroys a compute instance. The error wraps
// ErrNotFound when it (or its GPU instance) does not exist.
func (b *Backend) DestroyComputeInstance(busID string, gi, ci int) error {
	return b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		g, err := gpuInstance(dev, ref, gi)
		if err != nil {
			return err
		}
		c, ret := g.GetComputeInstanceById(ci)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			return ref.notFound(fmt.Sprintf("GPU instance %d: GetComputeInstanceById(%d)", gi, ci), ret)
		}
		if ret != nvml.SUCCESS {
			return ref.err(fmt.Sprintf("GPU instance %d: GetComputeInstanceById(%d)", gi, ci), ret)
		}
		if ret := c.Destroy(); ret != nvml.SUCCESS {
			return ref.err(fmt.Sprintf("GPU instance %d: destroy compute instance %d", gi, ci), ret)
		}
		return nil
	})
}

// DestroyGPUInstance destroys a GPU instance; its compute instances must
// be gone (else ERROR_IN_USE). The error wraps ErrNotFound when it does
// not exist.
func (b *Backend) DestroyGPUInstance(busID string, gi int) error {
	return b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		g, err := gpuInstance(dev, ref, gi)
		if err != nil {
			return err
		}
		if ret := g.Destroy(); ret != nvml.SUCCESS {
			return ref.err(fmt.Sprintf("destroy GPU instance %d", gi), ret)
		}
		return nil
	})
}
