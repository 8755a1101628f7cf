// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package model

import (
	"fmt"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
)

// migGB is the GB figure in a MIG profile name the way NVIDIA computes it:
// the profile's share of the board's memory, rounded up to eighths, times
// the board's memory in whole GiB (rounded up), rounded to the nearest GB.
// A100-40GB: 4864 MB of 40960 -> 1/8 * 40 = 5 -> "1g.5gb"; H200: 1/8 *
// 141 = 17.6 -> 18 -> "1g.18gb".
func migGB(totalMB, profileMB uint64) int {
	frac := float64(profileMB) / float64(totalMB)
	frac = math.Ceil(frac*8) / 8
	totalGB := float64((totalMB + 1023) / 1024)
	return int(math.Round(frac * totalGB))
}

// SliceName is NVIDIA's name of a plain MIG profile of slices compute
// slices and gb GB ("1g.10gb"); variants append to it ("+me").
func SliceName(slices, gb int) string { return fmt.Sprintf("%dg.%dgb", slices, gb) }

// ciSizes are the compute-instance sizes (in compute slices) a GPU instance
// of n compute slices offers, as `nvidia-smi mig -lcip` lists them: a 4g
// instance has no 3c profile, a 7g one has 1c, 2c, 3c, 4c and 7c.
var ciSizes = map[int][]int{1: {1}, 2: {1, 2}, 3: {1, 2, 3}, 4: {1, 2, 4}, 7: {1, 2, 3, 4, 7}}

// CIProfileIndex is the COMPUTE_INSTANCE_PROFILE_* index of a compute
// instance of k compute slices.
var CIProfileIndex = map[int]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
	2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
	4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
}

// ciPlacements are the placements of a k-slice compute instance inside a
// GPU instance of n compute slices: starts aligned to k rounded up to a
// power of two, as `nvidia-smi mig -lcipp` prints them (7g: 3c at {0,4},
// 2c at {0,2,4}; 3g: 2c at {0} only).
func ciPlacements(n, k int) []nvml.ComputeInstancePlacement {
	align := 1
	for align < k {
		align *= 2
	}
	var out []nvml.ComputeInstancePlacement
	for s := 0; s+k <= n; s += align {
		out = append(out, nvml.ComputeInstancePlacement{Start: uint32(s), Size: uint32(k)})
	}
	return out
}

// GIInfo is the GpuInstanceProfileInfo NVML reports for the profile.
func (p MIGProfile) GIInfo() nvml.GpuInstanceProfileInfo {
	return nvml.GpuInstanceProfileInfo{
		Id:                  p.ID,
		SliceCount:          uint32(p.Slices),
		InstanceCount:       uint32(p.Count),
		MultiprocessorCount: uint32(p.SM),
		CopyEngineCount:     uint32(p.CE),
		DecoderCount:        uint32(p.Dec),
		EncoderCount:        uint32(p.Enc),
		JpegCount:           uint32(p.JPEG),
		OfaCount:            uint32(p.OFA),
		MemorySizeMB:        p.MemMB,
	}
}

// GIInfoV3 is the same with the v3 name ("MIG 1g.10gb", as nvidia-smi
// prints it) and capabilities.
func (p MIGProfile) GIInfoV3() nvml.GpuInstanceProfileInfo_v3 {
	v1 := p.GIInfo()
	info := nvml.GpuInstanceProfileInfo_v3{
		Version:             nvml.STRUCT_VERSION(nvml.GpuInstanceProfileInfo_v3{}, 3),
		Id:                  v1.Id,
		SliceCount:          v1.SliceCount,
		InstanceCount:       v1.InstanceCount,
		MultiprocessorCount: v1.MultiprocessorCount,
		CopyEngineCount:     v1.CopyEngineCount,
		DecoderCount:        v1.DecoderCount,
		EncoderCount:        v1.EncoderCount,
		JpegCount:           v1.JpegCount,
		OfaCount:            v1.OfaCount,
		MemorySizeMB:        v1.MemorySizeMB,
	}
	for i, c := range []byte("MIG " + p.Name) {
		if i == len(info.Name)-1 {
			break
		}
		info.Name[i] = int8(c)
	}
	return info
}

// Placements are the profile's GPU instance placements.
func (p MIGProfile) Placements() []nvml.GpuInstancePlacement {
	out := make([]nvml.GpuInstancePlacement, len(p.Starts))
	for i, s := range p.Starts {
		out[i] = nvml.GpuInstancePlacement{Start: uint32(s), Size: uint32(p.Size)}
	}
	return out
}

// NVMLConfig is the gpus.Config go-nvml's server builds the device from.
// GpuInstanceProfiles is keyed by GPU_INSTANCE_PROFILE_* index (what
// GetGpuInstanceProfileInfo takes); the other maps are keyed by the driver
// profile ID, because the server looks them up by info.Id and
// GpuInstanceInfo.ProfileId.
func (g *GPU) NVMLConfig() gpus.Config {
	c := g.Config
	mp := gpus.MIGProfileConfig{
		GpuInstanceProfiles:       map[int]nvml.GpuInstanceProfileInfo{},
		ComputeInstanceProfiles:   map[int]map[int]nvml.ComputeInstanceProfileInfo{},
		GpuInstancePlacements:     map[int][]nvml.GpuInstancePlacement{},
		ComputeInstancePlacements: map[int]map[int][]nvml.ComputeInstancePlacement{},
	}
	smPerSlice := g.Profiles[0].SM // the plain 1-slice profile comes first
	for _, p := range g.Profiles {
		id := int(p.ID)
		mp.GpuInstanceProfiles[p.Index] = p.GIInfo()
		mp.GpuInstancePlacements[id] = p.Placements()
		cis := map[int]nvml.ComputeInstanceProfileInfo{}
		cps := map[int][]nvml.ComputeInstancePlacement{}
		for _, k := range ciSizes[p.Slices] {
			idx := CIProfileIndex[k]
			pl := ciPlacements(p.Slices, k)
			sm := k * smPerSlice
			if k == p.Slices {
				sm = p.SM
			}
			cis[idx] = nvml.ComputeInstanceProfileInfo{
				Id:                    uint32(idx),
				SliceCount:            uint32(k),
				InstanceCount:         uint32(len(pl)),
				MultiprocessorCount:   uint32(sm),
				SharedCopyEngineCount: uint32(p.CE),
				SharedDecoderCount:    uint32(p.Dec),
				SharedEncoderCount:    uint32(p.Enc),
				SharedJpegCount:       uint32(p.JPEG),
				SharedOfaCount:        uint32(p.OFA),
			}
			cps[idx] = pl
		}
		mp.ComputeInstanceProfiles[id] = cis
		mp.ComputeInstancePlacements[id] = cps
	}
	c.MIGProfiles = mp
	return c
}

// Overlap tells whether two GPU instance placements share a memory slice.
func Overlap(a, b nvml.GpuInstancePlacement) bool {
	return a.Start < b.Start+b.Size && b.Start < a.Start+a.Size
}

// Placed is an existing (or hypothetical) GPU instance.
type Placed struct {
	Profile   MIGProfile
	Placement nvml.GpuInstancePlacement
}

// Fits says why a new instance of p at pl cannot join existing on a GPU of
// this model (ERROR_INSUFFICIENT_RESOURCES: an overlap, the profile's
// instance count or the compute slices used up), or SUCCESS.
func (g *GPU) Fits(existing []Placed, p MIGProfile, pl nvml.GpuInstancePlacement) nvml.Return {
	same, compute := 0, 0
	for _, e := range existing {
		compute += e.Profile.Slices
		if e.Profile.ID == p.ID {
			same++
		}
		if Overlap(e.Placement, pl) {
			return nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	}
	if same >= p.Count || compute+p.Slices > g.ComputeSlices {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}
