// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"maps"

	"github.com/hwdra/hwdra/internal/agent/slices/device"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hwdra/hwdra/internal/hw"
)

// gpuCounters is what one GPU's counter set holds: only the counters that
// decide something, because the scheduler pays for every counter on every
// device it considers (it copies and compares each counter set of the
// pool for each device it tries). What the hardware accepts of MIG is
// placements that do not overlap, at most InstanceCount of a profile
// (NVML reports per-profile engine counts, but no whole-GPU budget that
// would limit anything more): the memory-slice counters say the first, an
// instance counter the second where the placements alone would allow more.
// The whole GPU consumes every memory slice, so it and its partitions keep
// each other out. Time-sliced vGPUs take framebuffer.
type gpuCounters struct {
	// slices are the memory slices that get a counter, ascending.
	slices []int
	// instanceLimits are profiles whose published placements allow more
	// instances than InstanceCount, by profile ID.
	instanceLimits map[int]int
	// memory is the framebuffer counter's value, 0 for none.
	memory uint64
	// vfs is the VF counter's value, 0 for none.
	vfs int
	// exclusive: a counter "gpu" (1) that the whole GPU and its shares
	// consume, where no memory slice keeps them apart (a GPU without
	// MIG, or whose MIG mode cannot switch).
	exclusive bool
}

// countersFor sizes a GPU's counters for the devices it publishes.
//
// A memory slice needs no counter of its own where every device that
// covers it also covers another slice that has one: two such devices
// overlap there too (on an H100 every placement that covers slice 7 covers
// slice 6). Fewer counters, same exclusions.
func countersFor(g hw.GPU, planned []plannedDevice) gpuCounters {
	var c gpuCounters
	shares := false
	var covers []hw.Placement
	byProfile := map[int][]hw.Placement{}
	profiles := map[int]hw.MIGProfile{}
	for _, p := range planned {
		switch {
		case p.what.Kind == device.KindGPU, p.what.Kind == device.KindShare:
			covers = append(covers, hw.Placement{Start: 0, Size: g.MIG.MemorySlices})
			shares = shares || p.what.Kind == device.KindShare
		case p.what.Placement.Size > 0: // MIG, MIG-backed vGPU
			covers = append(covers, p.what.Placement)
			id := p.what.Profile.ID
			byProfile[id] = append(byProfile[id], p.what.Placement)
			profiles[id] = p.what.Profile
		default: // time-sliced vGPU
			c.memory = max(g.MemoryBytes, p.what.VGPUType.FramebufferBytes*uint64(p.what.VGPUType.MaxInstances))
		}
	}
	if len(byProfile) > 0 { // the whole GPU alone needs no slices
		dropped := map[int]bool{}
		for s := 0; s < g.MIG.MemorySlices; s++ {
			for t := 0; t < g.MIG.MemorySlices; t++ {
				if t != s && !dropped[t] && coveredWith(covers, s, t) {
					dropped[s] = true
					break
				}
			}
			if !dropped[s] && coveredAtAll(covers, s) {
				c.slices = append(c.slices, s)
			}
		}
	}
	// The whole GPU and its shares keep each other out: through the
	// memory slices where MIG partitions need them anyway, else through a
	// counter of their own.
	c.exclusive = shares && len(c.slices) == 0
	c.vfs = vfLimit(g, planned, c.memory)
	for id, pls := range byProfile {
		p := profiles[id]
		if maxDisjoint(pls) > p.InstanceCount {
			if c.instanceLimits == nil {
				c.instanceLimits = map[int]int{}
			}
			c.instanceLimits[id] = p.InstanceCount
		}
	}
	return c
}

// vfLimit is the VF counter's value: the GPU's VFs where fewer are
// enabled than the published vGPUs could take at once (each vGPU takes a
// VF, of either framework where the GPU has VFs), 0 where the framebuffer
// and the placements run out first (the vGPU manager enables as many VFs
// as the GPU can host vGPUs: an H100 has 32 and hosts at most 20). At
// once means one group's devices: time-sliced blocks as far as the
// framebuffer (memory) holds them, or MIG-backed vGPUs at disjoint
// placements; compatibility groups keep the two apart.
func vfLimit(g hw.GPU, planned []plannedDevice, memory uint64) int {
	if g.VGPU.VFs <= 0 {
		return 0
	}
	var placements []hw.Placement
	seen := map[hw.Placement]bool{}
	most := map[uint64]int{0: 0} // framebuffer taken -> most vGPUs in it
	for _, p := range planned {
		switch {
		case p.what.Kind != device.KindVGPU:
		case p.what.Placement.Size > 0:
			if !seen[p.what.Placement] {
				seen[p.what.Placement] = true
				placements = append(placements, p.what.Placement)
			}
		default:
			next := maps.Clone(most)
			for used, n := range most {
				if u := used + p.memory; u <= memory {
					next[u] = max(next[u], n+p.instances)
				}
			}
			most = next
		}
	}
	atOnce := maxDisjoint(placements)
	for _, n := range most {
		atOnce = max(atOnce, n)
	}
	if g.VGPU.VFs >= atOnce {
		return 0
	}
	return g.VGPU.VFs
}

// coveredWith: some placement covers s, and every one that does covers t.
func coveredWith(covers []hw.Placement, s, t int) bool {
	any := false
	for _, pl := range covers {
		if pl.Start <= s && s < pl.Start+pl.Size {
			if !(pl.Start <= t && t < pl.Start+pl.Size) {
				return false
			}
			any = true
		}
	}
	return any
}

func coveredAtAll(covers []hw.Placement, s int) bool {
	for _, pl := range covers {
		if pl.Start <= s && s < pl.Start+pl.Size {
			return true
		}
	}
	return false
}

func placementMask(p hw.Placement) uint64 {
	if p.Size <= 0 || p.Start < 0 || p.Start+p.Size > 64 {
		return 0
	}
	return (uint64(1)<<p.Size - 1) << p.Start
}

// maxDisjoint is the largest number of non-overlapping placements.
func maxDisjoint(placements []hw.Placement) int {
	best := 0
	var walk func(from int, used uint64, n int)
	walk = func(from int, used uint64, n int) {
		best = max(best, n)
		for j := from; j < len(placements); j++ {
			m := placementMask(placements[j])
			if used&m == 0 {
				walk(j+1, used|m, n+1)
			}
		}
	}
	walk(0, 0, 0)
	return best
}

// counterSet is the GPU's counter set.
func (c gpuCounters) counterSet(name string, profiles []hw.MIGProfile) resourceapi.CounterSet {
	set := map[string]resourceapi.Counter{}
	if c.memory > 0 {
		set[device.CounterMemory] = bytesCounter(c.memory)
	}
	if c.vfs > 0 {
		set[device.CounterVFs] = intCounter(c.vfs)
	}
	if c.exclusive {
		set[device.CounterExclusive] = intCounter(1)
	}
	for _, s := range c.slices {
		set[device.MemorySliceCounter(s)] = intCounter(1)
	}
	for _, p := range profiles {
		if limit, ok := c.instanceLimits[p.ID]; ok {
			set[device.InstancesCounter(p.Name)] = intCounter(limit)
		}
	}
	return resourceapi.CounterSet{Name: name, Counters: set}
}

// wholeGPU is what the whole GPU (and the first of its shares) consumes:
// every memory slice, or the exclusive counter.
func (c gpuCounters) wholeGPU() map[string]resourceapi.Counter {
	out := make(map[string]resourceapi.Counter, len(c.slices)+1)
	for _, s := range c.slices {
		out[device.MemorySliceCounter(s)] = intCounter(1)
	}
	if c.exclusive {
		out[device.CounterExclusive] = intCounter(1)
	}
	return out
}

// placement is what one instance of p at pl consumes: its memory slices,
// and one of p's instances where they are counted.
func (c gpuCounters) placement(p hw.MIGProfile, pl hw.Placement) map[string]resourceapi.Counter {
	out := map[string]resourceapi.Counter{}
	for _, s := range c.slices {
		if pl.Start <= s && s < pl.Start+pl.Size {
			out[device.MemorySliceCounter(s)] = intCounter(1)
		}
	}
	if _, ok := c.instanceLimits[p.ID]; ok {
		out[device.InstancesCounter(p.Name)] = intCounter(1)
	}
	return out
}

func bytesCounter(v uint64) resourceapi.Counter {
	return resourceapi.Counter{Value: *resource.NewQuantity(int64(v), resource.BinarySI)}
}

func intCounter(v int) resourceapi.Counter {
	return resourceapi.Counter{Value: *resource.NewQuantity(int64(v), resource.DecimalSI)}
}
