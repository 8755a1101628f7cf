// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"fmt"
	"iter"
	"math"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
)

// Profile IDs. NVML has two kinds, and they differ on hardware:
//   - the GPU_INSTANCE_PROFILE_* constants (0..GPU_INSTANCE_PROFILE_COUNT-1)
//     that GetGpuInstanceProfileInfo takes. hw.MIGProfile.ID,
//     hw.GPUInstance.ProfileID and hw.VGPUType.GPUInstanceProfileID are
//     these.
//   - the driver's profile ID in GpuInstanceProfileInfo.Id (nvidia-smi's
//     "ID" column: 1g.10gb is 19, 7g.80gb is 0). GetGpuInstances,
//     GpuInstanceInfo.ProfileId and VgpuTypeGetGpuInstanceProfileId use
//     this one; we map it back to the constant.
//
// Canonical names: NVIDIA names a profile "<slices>g.<GB>gb" (see migGB)
// plus a suffix for the variants of a slice count:
//   - *_REV1 (1_SLICE_REV1, 2_SLICE_REV1): "+me", media extensions: the
//     GPU's decoders/JPEG/OFA go to one small instance (1g.10gb+me).
//   - 1_SLICE_REV2: no suffix; twice the memory of the 1-slice profile, so
//     the GB differs (1g.20gb on H100, 1g.10gb on A100-40GB).
//   - *_GFX (1, 2, 3, 4 slices): "+gfx", graphics-capable (RTX PRO
//     Blackwell).
//   - *_NO_ME (1, 2 slices): "-me", no media engines.
//   - *_ALL_ME (1, 2 slices): "+me.all", all media engines of the GPU.
//
// Where the driver offers GetGpuInstanceProfileInfoV (v3 carries the name,
// "MIG 1g.10gb+me") that name is used; otherwise it is computed.
var profileSuffix = map[int]string{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1:   "+me",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:   "+me",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME:  "-me",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:  "-me",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: "+me.all",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: "+me.all",
}

// migGB is the GB in a profile name as NVIDIA rounds it: the profile's
// share of the GPU's memory rounded up to eighths, times the GPU's memory
// in GiB (rounded up), to the nearest integer. A100-40GB: 4864 MB ->
// 1/8 * 40 = 5 (1g.5gb); H100: 10240 MB -> 1/8 * 80 = 10 (1g.10gb); H200:
// 1/8 * 141 = 17.6 -> 18 (1g.18gb).
func migGB(totalBytes, profileMB uint64) int {
	frac := float64(profileMB<<20) / float64(totalBytes)
	frac = math.Ceil(frac*8) / 8
	totalGB := float64((totalBytes + 1<<30 - 1) >> 30)
	return int(math.Round(frac * totalGB))
}

func profileName(index int, info nvml.GpuInstanceProfileInfo, totalBytes uint64) string {
	return fmt.Sprintf("%dg.%dgb%s", info.SliceCount, migGB(totalBytes, info.MemorySizeMB), profileSuffix[index])
}

// profileInfoV3 is implemented by mock/gpusim's devices. go-nvml's
// GetGpuInstanceProfileInfoV returns a handler whose V2/V3 always call the
// C library, so no mock can answer through it.
type profileInfoV3 interface {
	GetGpuInstanceProfileInfoV3(profile int) (nvml.GpuInstanceProfileInfo_v3, nvml.Return)
}

// giProfile reads one GPU instance profile; ok is false where the GPU does
// not offer it.
func (b *Backend) giProfile(ref gpuRef, dev nvml.Device, index int, totalBytes uint64) (info nvml.GpuInstanceProfileInfo, name string, ok bool, err error) {
	info, name, ret := b.giProfileV(dev, index)
	if ret == nvml.ERROR_FUNCTION_NOT_FOUND || ret == nvml.ERROR_ARGUMENT_VERSION_MISMATCH {
		// No versioned call in this driver (or mock): v1 and a computed name.
		info, ret = dev.GetGpuInstanceProfileInfo(index)
	}
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
		return info, "", false, nil
	default:
		return info, "", false, ref.err(fmt.Sprintf("GetGpuInstanceProfileInfo(%d)", index), ret)
	}
	if name == "" {
		name = profileName(index, info, totalBytes)
	}
	return info, name, true, nil
}

// giProfileV reads a profile through the versioned call, which carries the
// name: v3, else v2 on drivers that know v2 only. ERROR_FUNCTION_NOT_FOUND
// where there is no versioned call to make.
func (b *Backend) giProfileV(dev nvml.Device, index int) (nvml.GpuInstanceProfileInfo, string, nvml.Return) {
	var v3 nvml.GpuInstanceProfileInfo_v3
	ret := nvml.ERROR_FUNCTION_NOT_FOUND
	if d, ok := dev.(profileInfoV3); ok {
		v3, ret = d.GetGpuInstanceProfileInfoV3(index)
	} else if isLibraryDevice(dev) && b.has("nvmlDeviceGetGpuInstanceProfileInfoV") {
		v3, ret = dev.GetGpuInstanceProfileInfoV(index).V3()
		if ret == nvml.ERROR_ARGUMENT_VERSION_MISMATCH {
			v2, ret := dev.GetGpuInstanceProfileInfoV(index).V2()
			return nvml.GpuInstanceProfileInfo{
				Id: v2.Id, IsP2pSupported: v2.IsP2pSupported, SliceCount: v2.SliceCount,
				InstanceCount: v2.InstanceCount, MultiprocessorCount: v2.MultiprocessorCount,
				CopyEngineCount: v2.CopyEngineCount, DecoderCount: v2.DecoderCount,
				EncoderCount: v2.EncoderCount, JpegCount: v2.JpegCount, OfaCount: v2.OfaCount,
				MemorySizeMB: v2.MemorySizeMB,
			}, strings.TrimPrefix(cString(v2.Name[:]), "MIG "), ret
		}
	}
	return nvml.GpuInstanceProfileInfo{
		Id: v3.Id, SliceCount: v3.SliceCount, InstanceCount: v3.InstanceCount,
		MultiprocessorCount: v3.MultiprocessorCount, CopyEngineCount: v3.CopyEngineCount,
		DecoderCount: v3.DecoderCount, EncoderCount: v3.EncoderCount,
		JpegCount: v3.JpegCount, OfaCount: v3.OfaCount, MemorySizeMB: v3.MemorySizeMB,
	}, strings.TrimPrefix(cString(v3.Name[:]), "MIG "), ret
}

// mig reads MIG capability, mode, profiles and, with MIG on, the existing
// instances. byDriverID maps the driver's profile IDs to
// GPU_INSTANCE_PROFILE_* indexes.
func (b *Backend) mig(ref gpuRef, dev nvml.Device, arch nvml.DeviceArchitecture, totalBytes uint64) (m hw.MIG, byDriverID map[uint32]int, err error) {
	current, pending, ret := dev.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return hw.MIG{}, nil, nil
	}
	if ret != nvml.SUCCESS {
		return hw.MIG{}, nil, ref.err("GetMigMode", ret)
	}
	m = hw.MIG{
		Capable: true,
		Enabled: current == nvml.DEVICE_MIG_ENABLE,
		Pending: pending == nvml.DEVICE_MIG_ENABLE,
		// Hardware quirk: Hopper and later apply a MIG mode change at once.
		// On Ampere it stays pending (GetMigMode: current != pending) until
		// the GPU is reset, which needs the GPU idle or a reboot. Unknown
		// architectures are assumed to need the reset.
		SwitchWithoutReset: switchWithoutReset(arch),
	}
	var infos []nvml.GpuInstanceProfileInfo
	byDriverID = map[uint32]int{}
	for index := 0; index < nvml.GPU_INSTANCE_PROFILE_COUNT; index++ {
		info, name, ok, err := b.giProfile(ref, dev, index, totalBytes)
		if err != nil {
			return hw.MIG{}, nil, err
		}
		if !ok {
			continue
		}
		p := hw.MIGProfile{
			ID: index, Name: name,
			Slices: int(info.SliceCount), InstanceCount: int(info.InstanceCount),
			Multiprocessors: int(info.MultiprocessorCount), CopyEngines: int(info.CopyEngineCount),
			Decoders: int(info.DecoderCount), Encoders: int(info.EncoderCount),
			JPEGEngines: int(info.JpegCount), OFAEngines: int(info.OfaCount),
			MemoryBytes: info.MemorySizeMB << 20,
		}
		// Placements are in memory slices (8 on A100/H100, 4 on A30).
		// Some drivers refuse this while MIG mode is off: no placements then.
		placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ok, err := ref.optional(fmt.Sprintf("GetGpuInstancePossiblePlacements(%s)", name), ret); err != nil {
			return hw.MIG{}, nil, err
		} else if ok {
			for _, pl := range placements {
				p.Placements = append(p.Placements, hw.Placement{Start: int(pl.Start), Size: int(pl.Size)})
				m.MemorySlices = max(m.MemorySlices, int(pl.Start+pl.Size))
			}
			slices.SortFunc(p.Placements, func(a, b hw.Placement) int { return a.Start - b.Start })
		}
		m.Profiles = append(m.Profiles, p)
		infos = append(infos, info)
		byDriverID[info.Id] = index
	}
	if !m.Enabled {
		return m, byDriverID, nil
	}
	if err := b.instances(ref, dev, &m, infos); err != nil {
		return hw.MIG{}, nil, err
	}
	return m, byDriverID, nil
}

// instances reads the GPU instances, their compute instances and MIG
// device UUIDs. NVML offers compute-instance profiles only through a GPU
// instance, so a profile's ComputeProfiles are filled from its first
// existing instance and stay empty for profiles without one.
func (b *Backend) instances(ref gpuRef, dev nvml.Device, m *hw.MIG, infos []nvml.GpuInstanceProfileInfo) error {
	for i := range m.Profiles {
		p := &m.Profiles[i]
		gis, ret := dev.GetGpuInstances(&infos[i])
		if ok, err := ref.optional(fmt.Sprintf("GetGpuInstances(%s)", p.Name), ret); err != nil {
			return err
		} else if !ok {
			continue
		}
		for _, gi := range gis {
			giInfo, ret := gi.GetInfo()
			if ret != nvml.SUCCESS {
				return ref.err("GpuInstance.GetInfo", ret)
			}
			inst := hw.GPUInstance{
				ID: int(giInfo.Id), ProfileID: p.ID,
				Placement: hw.Placement{Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size)},
			}
			cps, cis, err := computeInstances(ref, gi, p.Name)
			if err != nil {
				return err
			}
			if p.ComputeProfiles == nil {
				p.ComputeProfiles = cps
			}
			inst.ComputeInstances = cis
			m.Instances = append(m.Instances, inst)
		}
	}
	slices.SortFunc(m.Instances, func(a, b hw.GPUInstance) int { return a.Placement.Start - b.Placement.Start })
	b.migUUIDs(dev, m.Instances)
	return nil
}

func computeInstances(ref gpuRef, gi nvml.GpuInstance, name string) ([]hw.ComputeProfile, []hw.ComputeInstance, error) {
	profiles, err := ciProfiles(gi, ref, name)
	if err != nil {
		return nil, nil, err
	}
	var cps []hw.ComputeProfile
	var cis []hw.ComputeInstance
	for _, p := range profiles {
		cps = append(cps, hw.ComputeProfile{
			ID: p.index, Slices: int(p.info.SliceCount),
			InstanceCount: int(p.info.InstanceCount), Multiprocessors: int(p.info.MultiprocessorCount),
		})
		list, ret := gi.GetComputeInstances(&p.info)
		if ret != nvml.SUCCESS {
			return nil, nil, ref.err(fmt.Sprintf("GetComputeInstances(%s, %d)", name, p.index), ret)
		}
		for _, ci := range list {
			ciInfo, ret := ci.GetInfo()
			if ret != nvml.SUCCESS {
				return nil, nil, ref.err("ComputeInstance.GetInfo", ret)
			}
			cis = append(cis, hw.ComputeInstance{ID: int(ciInfo.Id), ProfileID: p.index})
		}
	}
	slices.SortFunc(cps, func(a, b hw.ComputeProfile) int { return a.ID - b.ID })
	slices.SortFunc(cis, func(a, b hw.ComputeInstance) int { return a.ID - b.ID })
	return cps, cis, nil
}

// migUUIDs fills the compute instances' MIG device UUIDs. They are
// optional: where NVML cannot tell, UUIDs stay empty.
func (b *Backend) migUUIDs(dev nvml.Device, instances []hw.GPUInstance) {
	devs, ret := migDevices(dev)
	if ret != nvml.SUCCESS {
		return
	}
	uuids := map[migAt]string{}
	for at, md := range devs {
		if id, ret := md.GetUUID(); ret == nvml.SUCCESS {
			uuids[at] = id
		}
	}
	for i := range instances {
		for j := range instances[i].ComputeInstances {
			ci := &instances[i].ComputeInstances[j]
			ci.UUID = uuids[migAt{instances[i].ID, ci.ID}]
		}
	}
}

// migAt is where a MIG device sits: its GPU and compute instance IDs.
type migAt struct{ gi, ci int }

// migDevices walks a GPU's MIG devices. NVML indexes them 0..max-1 with
// gaps (NOT_FOUND where no device sits, e.g. after a partition in the
// middle was destroyed); one whose instance IDs cannot be read is skipped.
func migDevices(dev nvml.Device) (iter.Seq2[migAt, nvml.Device], nvml.Return) {
	n, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return func(yield func(migAt, nvml.Device) bool) {
		for i := 0; i < n; i++ {
			md, ret := dev.GetMigDeviceHandleByIndex(i)
			if ret != nvml.SUCCESS {
				continue
			}
			gi, r1 := md.GetGpuInstanceId()
			ci, r2 := md.GetComputeInstanceId()
			if r1 != nvml.SUCCESS || r2 != nvml.SUCCESS {
				continue
			}
			if !yield(migAt{gi, ci}, md) {
				return
			}
		}
	}, nvml.SUCCESS
}
