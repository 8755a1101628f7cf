package resources

import (
	"fmt"
	"strconv"

	"github.com/hwdra/hwdra/slices/device"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hwdra/hwdra/hw"
)

// Counter names of a GPU's counter set.
const (
	counterMemory          = "memory"
	counterMultiprocessors = "multiprocessors"
	counterCopyEngines     = "copy-engines"
	counterDecoders        = "decoders"
	counterEncoders        = "encoders"
	counterJPEG            = "jpeg-engines"
	counterOFA             = "ofa-engines"
)

// engines are the per-profile amounts NVML reports, in counter order.
var engineCounters = [...]string{counterMultiprocessors, counterCopyEngines, counterDecoders, counterEncoders, counterJPEG, counterOFA}

type engineAmounts [len(engineCounters)]int

func profileEngines(p hw.MIGProfile) engineAmounts {
	return engineAmounts{p.Multiprocessors, p.CopyEngines, p.Decoders, p.Encoders, p.JPEGEngines, p.OFAEngines}
}

func memorySliceCounter(i int) string { return "memory-slice-" + strconv.Itoa(i) }

func instancesCounter(p hw.MIGProfile) string { return device.Name("instances", p.Name) }

// gpuBudget is what one GPU's counter set holds.
type gpuBudget struct {
	memory  uint64
	slices  int
	engines engineAmounts
	// instanceLimits are profiles whose InstanceCount the other counters
	// would not enforce, with that count.
	instanceLimits map[int]int
}

// budgetFor sizes a GPU's counters. NVML reports per-profile engine counts
// but not the whole GPU's, and the whole-GPU (7g) profile is not the sum of
// the small ones (an H100's 7g.80gb has fewer decoders than seven 1g.10gb).
// So each counter holds the most that any set of instances the hardware
// accepts (non-overlapping placements, at most InstanceCount per profile)
// can use: the counters then never refuse what the hardware allows, the
// memory-slice counters refuse overlaps, and scarce engines (the single OFA
// of a "+me" profile) are enforced where the table says so.
func budgetFor(g hw.GPU, cache map[string]gpuBudget) gpuBudget {
	key := budgetKey(g)
	if b, ok := cache[key]; ok {
		return b
	}
	b := gpuBudget{memory: g.MemoryBytes, slices: g.MIG.MemorySlices}
	if g.MIG.Capable {
		mem, eng := maxInstanceUsage(g.MIG.Profiles)
		b.memory = max(b.memory, mem)
		b.engines = eng
		for _, p := range g.MIG.Profiles {
			if !instanceCountEnforced(p, b) {
				if b.instanceLimits == nil {
					b.instanceLimits = map[int]int{}
				}
				b.instanceLimits[p.ID] = p.InstanceCount
			}
		}
	}
	for _, t := range g.VGPU.Types {
		if t.GPUInstanceProfileID == nil {
			b.memory = max(b.memory, t.FramebufferBytes*uint64(t.MaxInstances))
		}
	}
	cache[key] = b
	return b
}

func budgetKey(g hw.GPU) string {
	key := fmt.Sprintf("%s/%d/%d", g.ProductName, g.MemoryBytes, g.MIG.MemorySlices)
	for _, p := range g.MIG.Profiles {
		key += fmt.Sprintf("/%d:%d:%d:%v:%v", p.ID, p.InstanceCount, p.MemoryBytes, profileEngines(p), p.Placements)
	}
	for _, t := range g.VGPU.Types {
		key += fmt.Sprintf("/v%d:%d:%d", t.ID, t.FramebufferBytes, t.MaxInstances)
	}
	return key
}

// maxInstanceUsage walks every set of GPU instances the placement table and
// instance counts allow and returns, per counter, the largest use by any set.
func maxInstanceUsage(profiles []hw.MIGProfile) (uint64, engineAmounts) {
	type candidate struct {
		profile int
		mask    uint64
		mem     uint64
		eng     engineAmounts
	}
	var cands []candidate
	for i, p := range profiles {
		for _, pl := range p.Placements {
			cands = append(cands, candidate{profile: i, mask: placementMask(pl), mem: p.MemoryBytes, eng: profileEngines(p)})
		}
	}
	count := make([]int, len(profiles))
	var (
		bestMem, curMem uint64
		bestEng, curEng engineAmounts
	)
	var walk func(from int, used uint64)
	walk = func(from int, used uint64) {
		bestMem = max(bestMem, curMem)
		for k := range curEng {
			bestEng[k] = max(bestEng[k], curEng[k])
		}
		for j := from; j < len(cands); j++ {
			c := cands[j]
			if used&c.mask != 0 || count[c.profile] >= profiles[c.profile].InstanceCount {
				continue
			}
			count[c.profile]++
			curMem += c.mem
			for k := range curEng {
				curEng[k] += c.eng[k]
			}
			walk(j+1, used|c.mask)
			count[c.profile]--
			curMem -= c.mem
			for k := range curEng {
				curEng[k] -= c.eng[k]
			}
		}
	}
	walk(0, 0)
	return bestMem, bestEng
}

func placementMask(p hw.Placement) uint64 {
	if p.Size <= 0 || p.Start < 0 || p.Start+p.Size > 64 {
		return 0
	}
	return (uint64(1)<<p.Size - 1) << p.Start
}

// instanceCountEnforced reports whether the counters alone keep the number
// of instances of p at or below its InstanceCount.
func instanceCountEnforced(p hw.MIGProfile, b gpuBudget) bool {
	if maxDisjoint(p.Placements) <= p.InstanceCount {
		return true
	}
	if p.MemoryBytes > 0 && int(b.memory/p.MemoryBytes) <= p.InstanceCount {
		return true
	}
	need := profileEngines(p)
	for k, amount := range need {
		if amount > 0 && b.engines[k]/amount <= p.InstanceCount {
			return true
		}
	}
	return false
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

// counterSet is the GPU's counter set: everything the full GPU consumes.
func (b gpuBudget) counterSet(name string, profiles []hw.MIGProfile) resourceapi.CounterSet {
	return resourceapi.CounterSet{Name: name, Counters: b.all(profiles)}
}

func (b gpuBudget) all(profiles []hw.MIGProfile) map[string]resourceapi.Counter {
	c := map[string]resourceapi.Counter{counterMemory: bytesCounter(b.memory)}
	for i := 0; i < b.slices; i++ {
		c[memorySliceCounter(i)] = intCounter(1)
	}
	for k, name := range engineCounters {
		if b.engines[k] > 0 {
			c[name] = intCounter(b.engines[k])
		}
	}
	for _, p := range profiles {
		if limit, ok := b.instanceLimits[p.ID]; ok {
			c[instancesCounter(p)] = intCounter(limit)
		}
	}
	return c
}

// migConsumption is what one instance of p at placement pl consumes.
func (b gpuBudget) migConsumption(p hw.MIGProfile, pl hw.Placement) map[string]resourceapi.Counter {
	c := map[string]resourceapi.Counter{counterMemory: bytesCounter(p.MemoryBytes)}
	for i := pl.Start; i < pl.Start+pl.Size; i++ {
		c[memorySliceCounter(i)] = intCounter(1)
	}
	for k, amount := range profileEngines(p) {
		if amount > 0 && b.engines[k] > 0 {
			c[engineCounters[k]] = intCounter(amount)
		}
	}
	if _, ok := b.instanceLimits[p.ID]; ok {
		c[instancesCounter(p)] = intCounter(1)
	}
	return c
}

func bytesCounter(v uint64) resourceapi.Counter {
	return resourceapi.Counter{Value: *resource.NewQuantity(int64(v), resource.BinarySI)}
}

func intCounter(v int) resourceapi.Counter {
	return resourceapi.Counter{Value: *resource.NewQuantity(int64(v), resource.DecimalSI)}
}
