package mock

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

func sliceName(slices, gb int) string { return fmt.Sprintf("%dg.%dgb", slices, gb) }

// ciSizes are the compute-instance sizes (in compute slices) a GPU instance
// of n compute slices offers, as `nvidia-smi mig -lcip` lists them: a 4g
// instance has no 3c profile, a 7g one has 1c, 2c, 3c, 4c and 7c.
var ciSizes = map[int][]int{1: {1}, 2: {1, 2}, 3: {1, 2, 3}, 4: {1, 2, 4}, 7: {1, 2, 3, 4, 7}}

var ciProfileIndex = map[int]int{
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

// giInfo is the GpuInstanceProfileInfo NVML reports for a row.
func (p profileRow) giInfo() nvml.GpuInstanceProfileInfo {
	return nvml.GpuInstanceProfileInfo{
		Id:                  p.id,
		SliceCount:          uint32(p.slices),
		InstanceCount:       uint32(p.count),
		MultiprocessorCount: uint32(p.sm),
		CopyEngineCount:     uint32(p.ce),
		DecoderCount:        uint32(p.dec),
		EncoderCount:        uint32(p.enc),
		JpegCount:           uint32(p.jpeg),
		OfaCount:            uint32(p.ofa),
		MemorySizeMB:        p.memMB,
	}
}

// giInfoV3 is the same with the v3 name ("MIG 1g.10gb", as nvidia-smi
// prints it) and capabilities.
func (p profileRow) giInfoV3() nvml.GpuInstanceProfileInfo_v3 {
	v1 := p.giInfo()
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
	for i, c := range []byte("MIG " + p.name) {
		if i == len(info.Name)-1 {
			break
		}
		info.Name[i] = int8(c)
	}
	return info
}

// placements are the row's GPU instance placements.
func (p profileRow) placements() []nvml.GpuInstancePlacement {
	out := make([]nvml.GpuInstancePlacement, len(p.starts))
	for i, s := range p.starts {
		out[i] = nvml.GpuInstancePlacement{Start: uint32(s), Size: uint32(p.size)}
	}
	return out
}

// nvmlConfig is the gpus.Config go-nvml's server builds the device from.
// GpuInstanceProfiles is keyed by GPU_INSTANCE_PROFILE_* index (what
// GetGpuInstanceProfileInfo takes); the other maps are keyed by the driver
// profile ID, because the server looks them up by info.Id and
// GpuInstanceInfo.ProfileId.
func (g *gpuModel) nvmlConfig() gpus.Config {
	c := g.config
	mp := gpus.MIGProfileConfig{
		GpuInstanceProfiles:       map[int]nvml.GpuInstanceProfileInfo{},
		ComputeInstanceProfiles:   map[int]map[int]nvml.ComputeInstanceProfileInfo{},
		GpuInstancePlacements:     map[int][]nvml.GpuInstancePlacement{},
		ComputeInstancePlacements: map[int]map[int][]nvml.ComputeInstancePlacement{},
	}
	smPerSlice := g.profiles[0].sm // the plain 1-slice profile comes first
	for _, p := range g.profiles {
		id := int(p.id)
		mp.GpuInstanceProfiles[p.index] = p.giInfo()
		mp.GpuInstancePlacements[id] = p.placements()
		cis := map[int]nvml.ComputeInstanceProfileInfo{}
		cps := map[int][]nvml.ComputeInstancePlacement{}
		for _, k := range ciSizes[p.slices] {
			idx := ciProfileIndex[k]
			pl := ciPlacements(p.slices, k)
			sm := k * smPerSlice
			if k == p.slices {
				sm = p.sm
			}
			cis[idx] = nvml.ComputeInstanceProfileInfo{
				Id:                    uint32(idx),
				SliceCount:            uint32(k),
				InstanceCount:         uint32(len(pl)),
				MultiprocessorCount:   uint32(sm),
				SharedCopyEngineCount: uint32(p.ce),
				SharedDecoderCount:    uint32(p.dec),
				SharedEncoderCount:    uint32(p.enc),
				SharedJpegCount:       uint32(p.jpeg),
				SharedOfaCount:        uint32(p.ofa),
			}
			cps[idx] = pl
		}
		mp.ComputeInstanceProfiles[id] = cis
		mp.ComputeInstancePlacements[id] = cps
	}
	c.MIGProfiles = mp
	return c
}
