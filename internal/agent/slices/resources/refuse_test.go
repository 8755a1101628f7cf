// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/hwdra/hwdra/internal/agent/slices/device"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/model"
	mockprofile "github.com/hwdra/hwdra/internal/mock/profile"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// gpuModes are the modes every mock GPU model is tested in: MIG off as
// shipped (Hopper and later can switch, so their MIG partitions are
// offered too), MIG on, host-vGPU mode with time-sliced types of one size
// at a time or mixed, host-vGPU through the vendor-specific VFIO framework
// (Ada and later), and bound to vfio-pci for passthrough.
var gpuModes = []struct{ name, yaml string }{
	{"mig-off", ""},
	{"mig-on", "\n  mig: true"},
	{"host-vgpu", "\n  virtualization: host-vgpu"},
	{"host-vgpu-mixed", "\n  virtualization: host-vgpu\n  vgpuHeterogeneous: true"},
	{"host-vgpu-vfio", "\n  virtualization: host-vgpu\n  vgpuFramework: vfio\n  vgpuHeterogeneous: true"},
	{"passthrough", "\n  virtualization: passthrough"},
}

// mockGPUPool probes a mock node of n GPUs of one model in one mode and
// builds its GPU pool.
func mockGPUPool(t testing.TB, model, modeYAML string, n int) resourceslice.DriverResources {
	t.Helper()
	return inventoryGPUPool(probe(t, "mock:"+mockGPUFile(t, model, modeYAML, n)))
}

// inventoryGPUPool is the GPU pool of a node's inventory, passthrough GPUs
// included.
func inventoryGPUPool(inv hw.Inventory) resourceslice.DriverResources {
	return TaintedGPU(testNode, inv.GPUs, inv.PassthroughGPUs, device.AllFeatures, Health{}, config.GPUPolicy{})
}

func mockGPUFile(t testing.TB, model, modeYAML string, n int) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "node.yaml")
	profile := fmt.Sprintf("gpus:\n- model: %s\n  count: %d%s\n", model, n, modeYAML)
	if err := os.WriteFile(file, []byte(profile), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// skipUnlessMode skips where the model has no such mode (heterogeneous
// vGPU before Hopper).
func skipUnlessMode(t *testing.T, model, modeYAML string) {
	t.Helper()
	if _, err := mockprofile.Load(mockGPUFile(t, model, modeYAML, 1)); err != nil {
		t.Skipf("%s: %v", model, err)
	}
}

// refuseBound is how long one allocation may take before the test calls it
// hung: the scheduler's default filter timeout. The goal (refused within
// 1 s per node) is BenchmarkRefusal's.
const refuseBound = 10 * time.Second

// kind is what one request asks for: devices of one type and profile.
type kind struct {
	driver, typ, profile string
	shared               bool // published with allowMultipleAllocations
}

func (k kind) String() string {
	if k.shared {
		return k.typ + "/" + k.profile + " (shares)"
	}
	return k.typ + "/" + k.profile
}

func (k kind) selector() string {
	if k.driver == device.NICDriver {
		return fmt.Sprintf(`device.attributes["sriov.hwdra.io"].mode == %q`, k.profile)
	}
	return fmt.Sprintf(`device.attributes["gpu.hwdra.io"].type == %q && device.attributes["gpu.hwdra.io"].profile == %q`, k.typ, k.profile)
}

// kindsOf lists the kinds of device a pool offers.
func kindsOf(driver string, res resourceslice.DriverResources) []kind {
	seen := map[kind]bool{}
	for _, p := range res.Pools {
		for _, s := range p.Slices {
			for _, d := range s.Devices {
				k := kind{driver: driver, shared: d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations}
				if driver == device.NICDriver {
					k.typ, k.profile = "nic", *d.Attributes[device.NICAttrMode].StringValue
				} else {
					k.typ, k.profile = *d.Attributes[device.AttrType].StringValue, *d.Attributes[device.AttrProfile].StringValue
				}
				seen[k] = true
			}
		}
	}
	var out []kind
	for k := range seen {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// allocateWithin allocates the claims together within refuseBound and
// reports whether they fit and how long the allocator took. A claim above
// the API's limit of devices per claim (which the API server would not
// store) is refused before any search, with an error. A timeout or
// another error is returned.
func allocateWithin(a *allocate.Allocator, claims ...*resourceapi.ResourceClaim) (bool, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), refuseBound)
	defer cancel()
	start := time.Now()
	err := a.Allocate(ctx, claims...)
	took := time.Since(start)
	switch {
	case err == nil:
		return true, took, nil
	case errors.Is(err, allocate.ErrUnsatisfiable):
		return false, took, nil
	case errors.Is(err, context.DeadlineExceeded):
		return false, took, fmt.Errorf("not decided within %v: %w", refuseBound, err)
	case overClaimLimit(claims):
		return false, took, nil
	}
	return false, took, err
}

// overClaimLimit: some claim asks for more devices than a claim can hold.
func overClaimLimit(claims []*resourceapi.ResourceClaim) bool {
	for _, c := range claims {
		n := int64(0)
		for _, r := range c.Spec.Devices.Requests {
			if r.Exactly != nil {
				n += r.Exactly.Count
			}
		}
		if n > resourceapi.AllocationResultsMaxSize {
			return true
		}
	}
	return false
}

// census is what a node has of a kind, per unit (a GPU, or a PF): the
// devices, and what one-claim-at-a-time allocation gives.
type census struct {
	devices, capacity map[string]int
}

func (c census) total() (n int) {
	for _, v := range c.capacity {
		n += v
	}
	return n
}

// search is the number of device sets the allocator visits to refuse a
// request for one device more than the node holds: it tries every set of
// the kind's devices that fits, one unit's sets independent of another's.
func (c census) search() float64 {
	s := 1.0
	for u, d := range c.devices {
		sets := 0.0
		for j := 0; j <= min(c.capacity[u], d); j++ {
			sets += binomial(d, j)
		}
		s *= sets
	}
	return s
}

// needed: every device of the kind is needed to reach the node's capacity
// (one per instance), so no model with fewer devices offers as much.
func (c census) needed() bool {
	for u, d := range c.devices {
		if c.capacity[u] != d {
			return false
		}
	}
	return true
}

func binomial(n, k int) float64 {
	r := 1.0
	for i := 1; i <= k; i++ {
		r = r * float64(n-k+i) / float64(i)
	}
	return r
}

// unitOf is the GPU or PF a device belongs to.
func unitOf(d resourceapi.Device) string {
	if a, ok := d.Attributes[device.NICAttrPFPCIAddress]; ok {
		return *a.StringValue
	}
	return *d.Attributes["resource.kubernetes.io/pciBusID"].StringValue
}

// countKind fills a fresh allocator with one-device claims of a kind until
// one is refused, as pods arrive. A request takes a shareable device once:
// its capacity for one request is one per device.
func countKind(t testing.TB, newAlloc func() *allocate.Allocator, res resourceslice.DriverResources, k kind) census {
	t.Helper()
	byName := devicesByName(res)
	c := census{devices: map[string]int{}, capacity: map[string]int{}}
	for _, d := range byName {
		if kindsOf(k.driver, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{"": {Slices: []resourceslice.Slice{{Devices: []resourceapi.Device{d}}}}}})[0] == k {
			c.devices[unitOf(d)]++
		}
	}
	if k.shared {
		maps.Copy(c.capacity, c.devices)
		return c
	}
	a := newAlloc()
	for n := 0; n <= 1024; n++ {
		one := claim(request("one", k.driver, 1, k.selector()))
		ok, _, err := allocateWithin(a, one)
		if err != nil {
			t.Fatalf("%s: claim %d: %v", k, n+1, err)
		}
		if !ok {
			return c
		}
		c.capacity[unitOf(byName[allocatedDevices(one)[0]])]++
	}
	t.Fatalf("%s: more than 1024 one-device claims fit", k)
	return c
}

// maxSearch is the most device sets a refusal may cost on the test's
// nodes: well under a second for the scheduler's allocator on a node of
// 8 GPUs, far below refuseBound on a loaded machine (BenchmarkRefusal).
const maxSearch = 1 << 14

// refuseOneLarger checks every kind of device a node offers: one request
// for one device more than the node holds is refused, within refuseBound,
// and the node gives each kind at least one device. build makes the node
// with n units of hardware (GPUs; the NIC nodes are fixed).
//
// Where the allocator's search for a kind grows past maxSearch although
// every device of the kind is needed to reach the node's capacity (three
// 2g.20gb placements on each of eight H100s: 8^8 sets), no publication
// avoids the cost (docs/design.md, "What the scheduler pays"): that kind is checked on the
// largest node within maxSearch. Any other kind past it fails.
func refuseOneLarger(t *testing.T, driver string, units int, build func(units int) resourceslice.DriverResources) {
	res := build(units)
	kinds := kindsOf(driver, res)
	if len(kinds) == 0 {
		t.Fatal("no devices")
	}
	for _, k := range kinds {
		node, n := res, units
		alloc := func() *allocate.Allocator { return newAllocator(t, allocate.ClusterFeatures, ByDriver{driver: node}) }
		c := countKind(t, alloc, node, k)
		if c.total() == 0 {
			t.Errorf("%s: no device allocatable", k)
			continue
		}
		// Above the API's limit of devices per claim the allocator
		// refuses before it searches.
		if s := c.search(); c.total() < resourceapi.AllocationResultsMaxSize && s > maxSearch {
			if !c.needed() {
				t.Errorf("%s: refusing %d costs the allocator %.3g device sets: more devices than instances", k, c.total()+1, s)
				continue
			}
			for n > 1 && math.Pow(s, float64(n)/float64(units)) > maxSearch {
				n--
			}
			t.Logf("%s: %.3g device sets to refuse %d on %d units: the allocator's cost; checked on %d", k, s, c.total()+1, units, n)
			node = build(n)
			c = countKind(t, alloc, node, k)
		}
		fits, took, err := allocateWithin(alloc(), claim(request("all", k.driver, int64(c.total()+1), k.selector())))
		if err != nil {
			t.Errorf("%s: %d of %d: %v", k, c.total()+1, c.total(), err)
			continue
		}
		if fits {
			t.Errorf("%s: %d allocated where %d fit one at a time", k, c.total()+1, c.total())
		}
		t.Logf("%s: %d fit, %d refused in %v (%.3g device sets)", k, c.total(), c.total()+1, took.Round(time.Microsecond), c.search())
	}
}

// TestUnsatisfiableClaimsRefused: on every mock GPU model in every mode
// (eight GPUs), and on built-in nodes' NICs in shared and exclusive mode,
// a claim for one device more of a kind than the node holds is refused,
// and decided within the scheduler's filter timeout rather than searching
// until it.
func TestUnsatisfiableClaimsRefused(t *testing.T) {
	for _, model := range model.GPUNames() {
		for _, mode := range gpuModes {
			t.Run(model+"/"+mode.name, func(t *testing.T) {
				skipUnlessMode(t, model, mode.yaml)
				refuseOneLarger(t, device.GPUDriver, 8, func(n int) resourceslice.DriverResources {
					return mockGPUPool(t, model, mode.yaml, n)
				})
			})
		}
	}
	// The VM node: VFIO-framework vGPUs of mixed sizes beside a
	// passthrough GPU, as the built-in profile has them.
	t.Run("h100-vm", func(t *testing.T) {
		refuseOneLarger(t, device.GPUDriver, 1, func(int) resourceslice.DriverResources {
			return inventoryGPUPool(probe(t, "mock:h100-vm"))
		})
	})
	for _, node := range []string{"dgx-h100", "cx7"} {
		pfs := probe(t, "mock:"+node).PFs
		for _, mode := range []config.Mode{config.ModeShared, config.ModeExclusive} {
			t.Run(node+"/nic-"+string(mode), func(t *testing.T) {
				refuseOneLarger(t, device.NICDriver, len(pfs), func(int) resourceslice.DriverResources {
					res, _ := NIC(testNode, offer(mode, pfs...), device.AllFeatures)
					return res
				})
			})
		}
	}
}
