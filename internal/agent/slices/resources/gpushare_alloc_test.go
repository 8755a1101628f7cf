// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/model"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// gpuShare asks for one GPU share, with memory and compute requests
// unless "".
func gpuShare(name, memory, compute string) resourceapi.DeviceRequest {
	r := request(name, device.GPUDriver, 1, `device.attributes["gpu.hwdra.io"].type == "share"`)
	reqs := map[resourceapi.QualifiedName]resource.Quantity{}
	if memory != "" {
		reqs[device.GPUCapMemory] = resource.MustParse(memory)
	}
	if compute != "" {
		reqs[device.GPUCapCompute] = resource.MustParse(compute)
	}
	if len(reqs) > 0 {
		r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: reqs}
	}
	return r
}

func gpuAllocatorWith(t *testing.T, af structured.Features, f device.Features, gpus ...hw.GPU) *allocate.Allocator {
	t.Helper()
	return newAllocator(t, af, map[string]resourceslice.DriverResources{device.GPUDriver: GPU(testNode, gpus, f)})
}

// Shares of one GPU fit while their compute and memory do: two of 40%
// fit, a third does not; each share consumes what it asked for, or the
// policy's default.
func TestSharesFitTheirGPU(t *testing.T) {
	a, _ := gpuAllocator(t, h100("0000:1b:00.0", 0))
	first, second := claim(gpuShare("s", "", "40")), claim(gpuShare("s", "", "40"))
	if !fits(t, a, first) || !fits(t, a, second) {
		t.Fatal("two 40% shares refused on one GPU")
	}
	if fits(t, a, claim(gpuShare("s", "", "40"))) {
		t.Fatal("a third 40% share allocated on one GPU")
	}
	r := first.Status.Allocation.Devices.Results[0]
	if r.Device != device.ShareName("0000:1b:00.0") || r.ShareID == nil {
		t.Errorf("allocated %s, share %v", r.Device, r.ShareID)
	}
	if got := r.ConsumedCapacity[device.GPUCapCompute]; got.Value() != 40 {
		t.Errorf("consumed compute %s, want 40", got.String())
	}
	if got := r.ConsumedCapacity[device.GPUCapMemory]; got.Value() != shareMemoryDefault {
		t.Errorf("consumed memory %s without a request, want the default %d", got.String(), shareMemoryDefault)
	}
	// 20% is left: one fits, with memory rounded up to the step.
	third := claim(gpuShare("s", "1500Mi", "20"))
	if !fits(t, a, third) {
		t.Fatal("a 20% share refused with 20% left")
	}
	if got := third.Status.Allocation.Devices.Results[0].ConsumedCapacity[device.GPUCapMemory]; got.Value() != 2<<30 {
		t.Errorf("1500Mi consumed as %s, want the next step, 2Gi", got.String())
	}
	a.Release(second)
	if !fits(t, a, claim(gpuShare("s", "", "40"))) {
		t.Error("a 40% share refused after one was released")
	}
}

// Memory is counted too: shares that together ask for more than the GPU
// has do not fit, whatever their compute.
func TestSharesCountMemory(t *testing.T) {
	a, _ := gpuAllocator(t, h100("0000:1b:00.0", 0))
	if !fits(t, a, claim(gpuShare("s", "60Gi", "1"))) {
		t.Fatal("a 60Gi share refused")
	}
	if fits(t, a, claim(gpuShare("s", "30Gi", "1"))) {
		t.Fatal("30Gi more allocated on an 80GB GPU")
	}
	if !fits(t, a, claim(gpuShare("s", "19Gi", "1"))) {
		t.Fatal("19Gi refused with 20Gi left")
	}
}

// A share asking for what no share can be (more memory than the GPU,
// compute 0 or above 100) is allocated nowhere.
func TestSharesOutOfPolicy(t *testing.T) {
	for _, tc := range []struct{ name, memory, compute string }{
		{"more memory than the GPU", "100Gi", ""},
		{"more compute than the GPU", "", "101"},
	} {
		a, _ := gpuAllocator(t, h100("0000:1b:00.0", 0))
		if fits(t, a, claim(gpuShare("s", tc.memory, tc.compute))) {
			t.Errorf("%s: allocated", tc.name)
		}
	}
	// 0 is raised to the least share (the policy's minimum): never nothing.
	a, _ := gpuAllocator(t, h100("0000:1b:00.0", 0))
	c := claim(gpuShare("s", "0", "0"))
	if !fits(t, a, c) {
		t.Fatal("a share of 0 refused")
	}
	r := c.Status.Allocation.Devices.Results[0]
	if m, p := r.ConsumedCapacity[device.GPUCapMemory], r.ConsumedCapacity[device.GPUCapCompute]; m.Value() != shareMemoryStep || p.Value() != 1 {
		t.Errorf("a share of 0 consumed %s and %s, want the least, 1Gi and 1", m.String(), p.String())
	}
}

// A share and the whole GPU, or a share and a MIG partition of that GPU,
// are never allocated together, in either order; the other GPU of the
// node stays free for them.
func TestSharesExcludeTheGPUsOtherDevices(t *testing.T) {
	const bus, other = "0000:1b:00.0", "0000:43:00.0"
	on := func(r resourceapi.DeviceRequest, gpu string) resourceapi.DeviceRequest {
		r = *r.DeepCopy()
		r.Exactly.Selectors = append(r.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.attributes["resource.kubernetes.io"].pciBusID == %q`, gpu)}})
		return r
	}
	exclusive := map[string]resourceapi.DeviceRequest{
		"the whole GPU":   profile("gpu", device.ProfileFull, 1),
		"a MIG partition": profile("mig", "1g.10gb", 1),
	}
	for name, req := range exclusive {
		t.Run("a share, then "+name, func(t *testing.T) {
			a, _ := gpuAllocator(t, h100(bus, 0), h100(other, 0))
			if !fits(t, a, claim(on(gpuShare("s", "", "10"), bus))) {
				t.Fatal("share refused")
			}
			if fits(t, a, claim(on(req, bus))) {
				t.Fatalf("%s allocated beside a share of its GPU", name)
			}
			if !fits(t, a, claim(on(req, other))) {
				t.Fatalf("%s refused on the other GPU", name)
			}
		})
		t.Run(name+", then a share", func(t *testing.T) {
			a, _ := gpuAllocator(t, h100(bus, 0), h100(other, 0))
			held := claim(on(req, bus))
			if !fits(t, a, held) {
				t.Fatalf("%s refused", name)
			}
			if fits(t, a, claim(on(gpuShare("s", "", "10"), bus))) {
				t.Fatalf("a share allocated beside %s of its GPU", name)
			}
			a.Release(held)
			if !fits(t, a, claim(on(gpuShare("s", "", "10"), bus))) {
				t.Fatalf("a share refused after %s was released", name)
			}
		})
	}
	// One claim cannot take both either.
	a, _ := gpuAllocator(t, h100(bus, 0))
	if fits(t, a, claim(gpuShare("s", "", "10"), profile("mig", "1g.10gb", 1))) {
		t.Error("a share and a MIG partition of one GPU allocated in one claim")
	}
}

// A GPU with no MIG memory slices to count (no MIG, or MIG off and
// switching only with a reset) keeps its whole GPU and its shares apart
// through a counter of their own, in either order.
func TestSharesExcludeTheWholeGPUWithoutMIG(t *testing.T) {
	noMIG := h100("0000:1b:00.0", 0)
	noMIG.MIG = hw.MIG{}
	offNeedsReset := h100("0000:1b:00.0", 0)
	offNeedsReset.MIG.SwitchWithoutReset = false
	for name, g := range map[string]hw.GPU{"no MIG": noMIG, "MIG off, switching needs a reset": offNeedsReset} {
		t.Run(name, func(t *testing.T) {
			res := GPU(testNode, []hw.GPU{g}, device.AllFeatures)
			set := res.Pools[testNode].Slices[0].SharedCounters[0]
			if c, ok := set.Counters[device.CounterExclusive]; len(set.Counters) != 1 || !ok || c.Value.Value() != 1 {
				t.Fatalf("counters %v, want %s alone", set.Counters, device.CounterExclusive)
			}
			a := gpuAllocatorWith(t, allocate.ClusterFeatures, device.AllFeatures, g)
			share := claim(gpuShare("s", "", "10"))
			if !fits(t, a, share) || fits(t, a, claim(profile("gpu", device.ProfileFull, 1))) {
				t.Fatal("the whole GPU allocated beside a share, or the share refused")
			}
			if !fits(t, a, claim(gpuShare("s", "", "10"))) {
				t.Fatal("a second share refused")
			}
			b := gpuAllocatorWith(t, allocate.ClusterFeatures, device.AllFeatures, g)
			if !fits(t, b, claim(profile("gpu", device.ProfileFull, 1))) || fits(t, b, claim(gpuShare("s", "", "10"))) {
				t.Fatal("a share allocated beside the whole GPU, or the GPU refused")
			}
		})
	}
}

// Where the cluster lacks a feature the model falls back as the rest of
// it does: without consumable capacity no shares are published (a claim
// for one is unsatisfiable, the whole GPU still allocates); without
// compatibility groups shares are published and the counters still keep
// them and the GPU's other devices apart.
func TestSharesFallBack(t *testing.T) {
	const bus = "0000:1b:00.0"
	noCapacity := allocate.ClusterFeatures
	noCapacity.ConsumableCapacity = false
	f := device.AllFeatures
	f.ConsumableCapacity = false
	a := gpuAllocatorWith(t, noCapacity, f, h100(bus, 0))
	// (Capacity requests are refused outright by such a cluster.)
	if fits(t, a, claim(gpuShare("s", "", ""))) {
		t.Error("a share allocated without consumable capacity")
	}
	if !fits(t, a, claim(profile("gpu", device.ProfileFull, 1))) {
		t.Error("the whole GPU refused without consumable capacity")
	}

	noGroups := allocate.ClusterFeatures
	noGroups.CompatibilityGroups = false
	f = device.AllFeatures
	f.CompatibilityGroups = false
	a = gpuAllocatorWith(t, noGroups, f, h100(bus, 0))
	for i := range 2 { // the allocator keeps what it allocated: two halves
		if !fits(t, a, claim(gpuShare("s", "", "50"))) {
			t.Fatalf("share %d refused without compatibility groups", i+1)
		}
	}
	if fits(t, a, claim(profile("mig", "1g.10gb", 1))) || fits(t, a, claim(profile("gpu", device.ProfileFull, 1))) {
		t.Error("a MIG partition or the whole GPU allocated beside shares without compatibility groups")
	}
}

// TestShareClaimsOneLargerRefused: on every mock GPU model in every mode
// that offers shares (eight GPUs), claims fill the node with shares of
// the default size (4Gi, 10%) until one is refused, and that one is
// refused within the scheduler's filter timeout; a share one step larger
// than a GPU (its memory and 1Gi, or 101%) is refused within it too. (A
// request for one share more than the node has share devices is
// TestUnsatisfiableClaimsRefused's.)
func TestShareClaimsOneLargerRefused(t *testing.T) {
	for _, m := range model.GPUNames() {
		for _, mode := range gpuModes {
			t.Run(m+"/"+mode.name, func(t *testing.T) {
				skipUnlessMode(t, m, mode.yaml)
				res := mockGPUPool(t, m, mode.yaml, 8)
				shares, memory := 0, int64(0)
				for _, d := range devicesByName(res) {
					if *d.Attributes[device.AttrType].StringValue == device.KindShare {
						shares++
						c := d.Capacity[device.GPUCapMemory].Value
						memory = max(memory, c.Value())
					}
				}
				if shares == 0 {
					t.Skip("no shares in this mode")
				}
				a := newAllocator(t, allocate.ClusterFeatures, ByDriver{device.GPUDriver: res})
				held := 0
				for ; held <= 64*shares; held++ {
					ok, _, err := allocateWithin(a, claim(gpuShare("s", "", "")))
					if err != nil {
						t.Fatalf("share %d: %v", held+1, err)
					}
					if !ok {
						break
					}
				}
				// Each GPU holds min(memory/4Gi, 100/10) default shares.
				if want := shares * int(min(memory/shareMemoryDefault, 100/shareComputeDefault)); held != want {
					t.Errorf("%d default shares fit on %d GPUs, want %d", held, shares, want)
				}
				b := newAllocator(t, allocate.ClusterFeatures, ByDriver{device.GPUDriver: res})
				over := resource.NewQuantity(memory+shareMemoryStep, resource.BinarySI).String()
				for _, c := range []*resourceapi.ResourceClaim{claim(gpuShare("s", over, "")), claim(gpuShare("s", "", "101"))} {
					fits, took, err := allocateWithin(b, c)
					if err != nil || fits {
						t.Errorf("a share above a GPU (%v): allocated %v, %v", c.Spec.Devices.Requests[0].Exactly.Capacity.Requests, fits, err)
					}
					t.Logf("a share above a GPU (%v) refused in %v", c.Spec.Devices.Requests[0].Exactly.Capacity.Requests, took.Round(time.Microsecond))
				}
				t.Logf("%d default shares fit on %d GPUs, one more refused", held, shares)
			})
		}
	}
}
