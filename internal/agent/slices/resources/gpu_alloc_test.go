// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/agent/slices/device"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/deploy"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

func gpuAllocator(t testing.TB, gpus ...hw.GPU) (*allocate.Allocator, resourceslice.DriverResources) {
	res := GPU(testNode, gpus, device.AllFeatures)
	return newAllocator(t, allocate.ClusterFeatures, map[string]resourceslice.DriverResources{device.GPUDriver: res}), res
}

func TestSevenOneSlicePartitionsFitOnOneH100(t *testing.T) {
	a, _ := gpuAllocator(t, h100("0000:1b:00.0", 0))
	if fits(t, a, claim(profile("mig", "1g.10gb", 8))) {
		t.Fatal("eight 1g.10gb allocated in one claim on one H100")
	}
	var claims []*resourceapi.ResourceClaim
	for i := 0; i < 7; i++ {
		c := claim(profile("mig", "1g.10gb", 1))
		if !fits(t, a, c) {
			t.Fatalf("1g.10gb number %d refused", i+1)
		}
		claims = append(claims, c)
	}
	if fits(t, a, claim(profile("mig", "1g.10gb", 1))) {
		t.Fatal("eighth 1g.10gb allocated")
	}
	// One freed partition can be taken again.
	a.Release(claims[3])
	if !fits(t, a, claim(profile("mig", "1g.10gb", 1))) {
		t.Fatal("1g.10gb refused after one was released")
	}
}

// hardwareAccepts is the placement table's answer, computed independently
// of the slices: can instances of these profiles exist at once?
func hardwareAccepts(g hw.GPU, want []string) bool {
	byName := map[string]hw.MIGProfile{}
	count := map[string]int{}
	for _, p := range g.MIG.Profiles {
		byName[p.Name] = p
	}
	for _, w := range want {
		count[w]++
		if count[w] > byName[w].InstanceCount {
			return false
		}
	}
	used := make([]bool, g.MIG.MemorySlices)
	var place func(i int) bool
	place = func(i int) bool {
		if i == len(want) {
			return true
		}
		for _, pl := range byName[want[i]].Placements {
			free := true
			for s := pl.Start; s < pl.Start+pl.Size; s++ {
				free = free && !used[s]
			}
			if !free {
				continue
			}
			for s := pl.Start; s < pl.Start+pl.Size; s++ {
				used[s] = true
			}
			ok := place(i + 1)
			for s := pl.Start; s < pl.Start+pl.Size; s++ {
				used[s] = false
			}
			if ok {
				return true
			}
		}
		return false
	}
	return place(0)
}

// multisets lists every multiset of names with 1..maxSize members.
func multisets(names []string, maxSize int) [][]string {
	var out [][]string
	var walk func(from int, cur []string)
	walk = func(from int, cur []string) {
		if len(cur) > 0 {
			out = append(out, append([]string(nil), cur...))
		}
		if len(cur) == maxSize {
			return
		}
		for i := from; i < len(names); i++ {
			walk(i, append(cur, names[i]))
		}
	}
	walk(0, nil)
	return out
}

// offered is g with each MIG profile's placements cut to those the slices
// offer.
func offered(g hw.GPU, res resourceslice.DriverResources) hw.GPU {
	byProfile := map[string][]hw.Placement{}
	for _, d := range devicesByName(res) {
		if *d.Attributes[device.AttrType].StringValue != device.KindMIG {
			continue
		}
		p := *d.Attributes[device.AttrProfile].StringValue
		byProfile[p] = append(byProfile[p], hw.Placement{Start: int(*d.Attributes[device.AttrPlacementStart].IntValue), Size: int(*d.Attributes[device.AttrPlacementSize].IntValue)})
	}
	g.MIG.Profiles = slices.Clone(g.MIG.Profiles)
	for i := range g.MIG.Profiles {
		g.MIG.Profiles[i].Placements = byProfile[g.MIG.Profiles[i].Name]
	}
	return g
}

// TestPartitionSetsAllocatableExactlyWhenPlacementTableAllows: a set of
// MIG partitions is allocatable exactly when the offered placements hold
// it (every set of up to three, every set of four with a 1g.10gb+me, and
// larger ones at the edges), and the offered placements hold every set the
// hardware's table does but the one layout the +me's two placements give
// up (gpu.go, offeredPlacements).
func TestPartitionSetsAllocatableExactlyWhenPlacementTableAllows(t *testing.T) {
	g := h100("0000:1b:00.0", 0)
	_, published := gpuAllocator(t, g)
	table := offered(g, published)
	var names []string
	for _, p := range g.MIG.Profiles {
		names = append(names, p.Name)
	}
	sets := multisets(names, 3)
	for _, set := range multisets(names, 3) {
		if len(set) == 3 {
			sets = append(sets, append([]string{"1g.10gb+me"}, set...))
		}
	}
	// Larger sets at the edges of what fits.
	sets = append(sets,
		[]string{"4g.40gb", "3g.40gb"},
		[]string{"4g.40gb", "2g.20gb", "1g.10gb"},
		[]string{"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"},
		[]string{"2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"},
		[]string{"2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb", "1g.10gb"},
		[]string{"1g.20gb", "1g.20gb", "1g.20gb", "1g.20gb"},
		[]string{"1g.20gb", "1g.20gb", "1g.20gb", "1g.20gb", "1g.10gb"},
		[]string{"1g.10gb+me", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb"},
		[]string{"1g.10gb+me", "1g.10gb+me"},
		[]string{"3g.40gb", "3g.40gb", "1g.10gb"},
	)
	accepted, refused := 0, 0
	var lost []string
	for _, set := range sets {
		want := hardwareAccepts(table, set)
		if hardwareAccepts(g, set) != want {
			lost = append(lost, strings.Join(set, "+"))
		}
		a, res := gpuAllocator(t, g)
		var reqs []resourceapi.DeviceRequest
		for i, p := range set {
			reqs = append(reqs, profile(fmt.Sprintf("r%d", i), p, 1))
		}
		c := claim(reqs...)
		got := fits(t, a, c)
		if got != want {
			t.Errorf("%s: allocator says %v, offered placements say %v", strings.Join(set, "+"), got, want)
			continue
		}
		if got {
			accepted++
			assertNoOverlap(t, res, allocatedDevices(c))
		} else {
			refused++
		}
	}
	if accepted < 20 || refused < 20 {
		t.Fatalf("too few cases each way: %d accepted, %d refused", accepted, refused)
	}
	if want := []string{"1g.10gb+me+1g.10gb+4g.40gb+1g.20gb"}; !slices.Equal(lost, want) {
		t.Errorf("sets the hardware holds but the offered placements do not: %v, want %v", lost, want)
	}
	t.Logf("%d sets accepted, %d refused, all as the offered placements say; %v lost to the +me's two placements", accepted, refused, lost)
}

// assertNoOverlap checks the allocated partitions occupy disjoint slices.
func assertNoOverlap(t *testing.T, res resourceslice.DriverResources, names []string) {
	t.Helper()
	byName := devicesByName(res)
	var got []hw.Placement
	for _, n := range names {
		d := byName[n]
		pl := hw.Placement{Start: int(*d.Attributes[device.AttrPlacementStart].IntValue), Size: int(*d.Attributes[device.AttrPlacementSize].IntValue)}
		for _, o := range got {
			if o.Overlaps(pl) {
				t.Errorf("allocated overlapping placements %v and %v (%v)", o, pl, names)
			}
		}
		got = append(got, pl)
	}
}

func devicesByName(res resourceslice.DriverResources) map[string]resourceapi.Device {
	out := map[string]resourceapi.Device{}
	for _, p := range res.Pools {
		for _, s := range p.Slices {
			for _, d := range s.Devices {
				out[d.Name] = d
			}
		}
	}
	return out
}

func TestFullGPUAndPartitionsExcludeEachOther(t *testing.T) {
	a, _ := gpuAllocator(t, h100("0000:1b:00.0", 0))
	mig := claim(profile("mig", "1g.10gb", 1))
	if !fits(t, a, mig) {
		t.Fatal("1g.10gb refused on an idle H100")
	}
	if fits(t, a, claim(profile("gpu", device.ProfileFull, 1))) {
		t.Fatal("full GPU allocated while a MIG partition is allocated")
	}
	a.Release(mig)
	full := claim(profile("gpu", device.ProfileFull, 1))
	if !fits(t, a, full) {
		t.Fatal("full GPU refused after the partition was released")
	}
	for _, p := range []string{"1g.10gb", "7g.80gb", "1g.10gb+me"} {
		if fits(t, a, claim(profile("mig", p, 1))) {
			t.Errorf("%s allocated while the full GPU is allocated", p)
		}
	}
}

func TestMIGAndVGPUNeverShareAGPU(t *testing.T) {
	type step struct {
		profile string
		fits    bool
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"mig then vgpu", []step{{"1g.10gb", true}, {"H100-20C", false}, {"H100-1-10C", false}}},
		{"time-sliced then mig", []step{{"H100-20C", true}, {"1g.10gb", false}, {"H100-1-10C", false}}},
		{"mig-backed vgpu then mig", []step{{"H100-1-10C", true}, {"1g.10gb", false}, {"H100-20C", false}}},
		{"two mig", []step{{"1g.10gb", true}, {"3g.40gb", true}}},
		{"two time-sliced of one type", []step{{"H100-20C", true}, {"H100-20C", true}}},
		{"two mig-backed types", []step{{"H100-1-10C", true}, {"H100-3-40C", true}}},
		// Without heterogeneous mode one time-sliced type at a time.
		{"two time-sliced types", []step{{"H100-20C", true}, {"H100-40C", false}}},
		{"no full GPU in host-vgpu mode", []step{{device.ProfileFull, false}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := gpuAllocator(t, h100VGPU("0000:1b:00.0"))
			for i, s := range tc.steps {
				if got := fits(t, a, claim(profile("d", s.profile, 1))); got != s.fits {
					t.Fatalf("step %d (%s): fits=%v, want %v", i, s.profile, got, s.fits)
				}
			}
		})
	}
}

func TestHeterogeneousVGPUTypesMix(t *testing.T) {
	g := h100VGPU("0000:1b:00.0")
	g.VGPU.Heterogeneous = true
	a, _ := gpuAllocator(t, g)
	if !fits(t, a, claim(profile("a", "H100-20C", 1))) || !fits(t, a, claim(profile("b", "H100-40C", 1))) {
		t.Fatal("heterogeneous GPU refused two time-sliced types")
	}
	// 20 + 40 GiB used: another 40 GiB does not fit in 80.
	if fits(t, a, claim(profile("c", "H100-40C", 1))) {
		t.Fatal("framebuffer over-committed")
	}
}

func TestPartitionsOfDifferentGPUsAreIndependent(t *testing.T) {
	a, _ := gpuAllocator(t, dgx(2)...)
	if !fits(t, a, claim(profile("full", device.ProfileFull, 1))) {
		t.Fatal("full GPU refused")
	}
	c := claim(profile("mig", "7g.80gb", 1))
	if !fits(t, a, c) {
		t.Fatal("7g.80gb refused on the second, idle GPU")
	}
	if fits(t, a, claim(profile("mig", "1g.10gb", 1))) {
		t.Fatal("partition allocated although both GPUs are in use")
	}
	devs := allocatedDevices(c)
	sort.Strings(devs)
	if len(devs) != 1 || !strings.HasPrefix(devs[0], "gpu-0000-") {
		t.Fatalf("unexpected device %v", devs)
	}
}

// TestMIGDistinctGPU: without a constraint the first-fit allocator puts two
// partitions on one GPU; distinctAttribute on the PCI address, which MIG
// devices share with their GPU, spreads them (deploy/examples/
// mig-on-distinct-gpus.yaml, allocated with the shipped classes).
func TestMIGDistinctGPU(t *testing.T) {
	example, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "deploy", "examples", "mig-on-distinct-gpus.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	classes, err := deploy.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	gpuOf := func(c *resourceapi.ResourceClaim, i int) string {
		return strings.SplitN(allocatedDevices(c)[i], "-mig-", 2)[0]
	}
	for _, distinct := range []bool{false, true} {
		t.Run(fmt.Sprintf("distinct=%v", distinct), func(t *testing.T) {
			c := &resourceapi.ResourceClaim{}
			if err := yaml.UnmarshalStrict(example, c); err != nil {
				t.Fatal(err)
			}
			c.Namespace, c.UID = "default", "uid-distinct"
			for _, r := range c.Spec.Devices.Requests { // the API server's defaults
				r.Exactly.AllocationMode, r.Exactly.Count = resourceapi.DeviceAllocationModeExactCount, 1
			}
			if !distinct {
				c.Spec.Devices.Constraints = nil
			}
			var objs []*resourceapi.ResourceSlice
			for _, s := range Objects(device.GPUDriver, testNode, GPU(testNode, dgx(2), device.AllFeatures)) {
				objs = append(objs, &s)
			}
			if err := allocate.New(allocate.ClusterFeatures, testNode, objs, classes).Allocate(context.Background(), c); err != nil {
				t.Fatal(err)
			}
			if got := gpuOf(c, 0) != gpuOf(c, 1); got != distinct {
				t.Errorf("devices %v: on different GPUs %v, want %v", allocatedDevices(c), got, distinct)
			}
		})
	}
}

// TestVGPUsNeverOutnumberVFs: each vGPU takes one of its GPU's VFs, so
// where fewer VFs are enabled than the framebuffer and the placements
// would hold vGPUs, a vfs counter keeps the scheduler within them: claims
// for one vGPU, alternating between types while any fits, get at most VFs
// vGPUs on a GPU and at least one (time-sliced with sizes mixed, where two
// types' blocks fit the framebuffer together but hold more vGPUs than
// VFs; MIG-backed, at disjoint placements). Where the VFs suffice, no vfs
// counter is published.
func TestVGPUsNeverOutnumberVFs(t *testing.T) {
	gib := uint64(1) << 30
	base := h100VGPU("0000:1b:00.0")
	base.VGPU.Framework = hw.VGPUFrameworkVFIO
	base.VGPU.Heterogeneous = true
	base.VGPU.Types = append(base.VGPU.Types, hw.VGPUType{ID: 4, Name: "NVIDIA H100-10C", Class: "Compute", FramebufferBytes: 10 * gib, MaxInstances: 8, Creatable: true})
	profile := func(p string) string {
		return fmt.Sprintf(`device.attributes["gpu.hwdra.io"].type == "vgpu" && device.attributes["gpu.hwdra.io"].profile == %q`, p)
	}
	for _, tc := range []struct {
		name     string
		profiles []string
		vfs      int
		counter  bool
	}{
		{"time-sliced/3", []string{"H100-20C", "H100-10C"}, 3, true},
		{"time-sliced/5", []string{"H100-20C", "H100-10C"}, 5, true},
		{"mig-backed/2", []string{"H100-1-10C", "H100-3-40C"}, 2, true},
		{"time-sliced/16", []string{"H100-20C", "H100-10C"}, 16, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := base
			g.VGPU.VFs = tc.vfs
			res := GPU(testNode, []hw.GPU{g}, device.AllFeatures)
			set := res.Pools[testNode].Slices[0].SharedCounters[0]
			if _, ok := set.Counters[device.CounterVFs]; ok != tc.counter {
				t.Errorf("vfs counter published %v, want %v (%v)", ok, tc.counter, set.Counters)
			}
			a := newAllocator(t, allocate.ClusterFeatures, ByDriver{device.GPUDriver: res})
			n, refused := 0, 0
			for i := 0; refused < len(tc.profiles) && n <= 64; i++ {
				if fits(t, a, claim(request("one", device.GPUDriver, 1, profile(tc.profiles[i%len(tc.profiles)])))) {
					n, refused = n+1, 0
				} else {
					refused++
				}
			}
			if n == 0 || n > tc.vfs {
				t.Errorf("%d vGPUs allocated on a GPU of %d VFs", n, tc.vfs)
			}
			t.Logf("%d vGPUs on %d VFs", n, tc.vfs)
		})
	}
}
