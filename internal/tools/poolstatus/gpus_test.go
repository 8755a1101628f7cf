// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package poolstatus

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/model"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

const node = "worker-1"

// gpuClass selects every device of the GPU driver: the claims below say
// exactly what they want.
var gpuClass = &resourceapi.DeviceClass{
	ObjectMeta: metav1.ObjectMeta{Name: "any-gpu"},
	Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
		CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.hwdra.io"`},
	}}},
}

// probe reads a mock node through the real backends: a built-in profile
// or, given YAML, a profile file of that text.
func probe(t testing.TB, profile string) (hw.Inventory, error) {
	t.Helper()
	if strings.Contains(profile, "\n") {
		file := filepath.Join(t.TempDir(), "node.yaml")
		if err := os.WriteFile(file, []byte(profile), 0o644); err != nil {
			t.Fatal(err)
		}
		profile = file
	}
	n, err := backend.Open("mock:" + profile)
	if err != nil {
		return hw.Inventory{}, err
	}
	defer n.Close()
	inv, err := n.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return inv, nil
}

var claimSeq int

// claimFor asks for count devices of one profile on one GPU.
func claimFor(bus, profile string, count int64) *resourceapi.ResourceClaim {
	return claimOf(bus, profile, allocate.Request("r", gpuClass.Name, count, ""))
}

// sharesFor asks for count instances of a profile published as devices
// that claims share: one request each, since a request takes a device
// once.
func sharesFor(bus, profile string, count int64) *resourceapi.ResourceClaim {
	var reqs []resourceapi.DeviceRequest
	for i := range count {
		reqs = append(reqs, allocate.Request(fmt.Sprintf("r%d", i), gpuClass.Name, 1, ""))
	}
	return claimOf(bus, profile, reqs...)
}

func claimOf(bus, profile string, reqs ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	claimSeq++
	cel := fmt.Sprintf(`device.attributes["resource.kubernetes.io"].pciBusID == %q && device.attributes["gpu.hwdra.io"].profile == %q`, bus, profile)
	for i := range reqs {
		reqs[i].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d", claimSeq), Namespace: "default", UID: types.UID(fmt.Sprintf("uid-%d", claimSeq))},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}},
	}
}

// fits allocates c and reports whether it fit; other errors fail.
func fits(t testing.TB, a *allocate.Allocator, c *resourceapi.ResourceClaim) bool {
	t.Helper()
	err := a.Allocate(context.Background(), c)
	if err != nil && !errors.Is(err, allocate.ErrUnsatisfiable) {
		t.Fatalf("allocate %s: %v", c.Name, err)
	}
	return err == nil
}

// TestAllocatableIsWhatTheAllocatorCanStillAllocate: on every GPU model the
// mock knows, with MIG off, MIG on, in host-vGPU mode (and heterogeneous
// vGPU where the model has it), and with a partition tainted, random
// sequences of allocations and releases run through the scheduler's
// allocator. After each step, for every GPU and profile, the report's
// allocatable n is what the allocator can still allocate: one claim for n
// devices of that profile on that GPU fits, one for n+1 does not.
func TestAllocatableIsWhatTheAllocatorCanStillAllocate(t *testing.T) {
	type mode struct{ name, yaml string }
	modes := []mode{
		{"mig-off", ""},
		{"mig-on", "\n  mig: true"},
		{"host-vgpu", "\n  virtualization: host-vgpu"},
		{"host-vgpu-heterogeneous", "\n  virtualization: host-vgpu\n  vgpuHeterogeneous: true"},
	}
	steps := 10
	if testing.Short() {
		steps = 4
	}
	checked, nonzero := 0, 0
	for _, model := range model.GPUNames() {
		for mi, m := range modes {
			for _, tainted := range []bool{false, true} {
				name := fmt.Sprintf("%s/%s/tainted=%v", model, m.name, tainted)
				t.Run(name, func(t *testing.T) {
					inv, err := probe(t, "gpus:\n- model: "+model+"\n  count: 2"+m.yaml+"\n")
					gpus := inv.GPUs
					if err != nil && m.name == "host-vgpu-heterogeneous" {
						t.Skip(err) // before Hopper
					} else if err != nil {
						t.Fatal(err)
					}
					var health hw.Health
					if tainted {
						health = partitionFault(gpus[0])
					}
					objs := resources.Objects(device.GPUDriver, node,
						resources.TaintedGPU(node, gpus, nil, device.AllFeatures, resources.Health{Faults: health}, config.GPUPolicy{}))
					ptrs := make([]*resourceapi.ResourceSlice, len(objs))
					for i := range objs {
						ptrs[i] = &objs[i]
					}
					a := allocate.New(allocate.ClusterFeatures, node, ptrs, []*resourceapi.DeviceClass{gpuClass})
					seed := uint64(len(model)*100 + mi*10)
					if tainted {
						seed++
					}
					rng := rand.New(rand.NewPCG(seed, 13))
					var held []*resourceapi.ResourceClaim
					n := steps
					if tainted {
						n /= 2 // the taint matters most while the GPU is still empty
					}
					for step := 0; step < n; step++ {
						if len(held) > 0 && rng.IntN(4) == 0 {
							i := rng.IntN(len(held))
							a.Release(held[i])
							held = slices.Delete(held, i, i+1)
						} else {
							g := gpus[rng.IntN(len(gpus))].PCIBusID
							profs := profilesOf(objs, g)
							c := claimFor(g, profs[rng.IntN(len(profs))], 1)
							if fits(t, a, c) {
								held = append(held, c)
							}
						}
						c := Cluster{Slices: objs}
						for _, h := range held {
							c.Claims = append(c.Claims, *h)
						}
						pools := Compute(c, device.GPUDriver)
						if len(pools) != 1 {
							t.Fatalf("%d pools", len(pools))
						}
						for _, g := range pools[0].GPUs {
							for _, p := range g.Profiles {
								checked++
								if p.Allocatable > 0 {
									nonzero++
								}
								if msg := stillAllocatable(t, a, objs, g.PCIBusID, p); msg != "" {
									t.Fatalf("step %d, %s %s: allocatable %d, but %s (held: %v)",
										step, g.PCIBusID, p.Profile, p.Allocatable, msg, heldDevices(held))
								}
							}
						}
					}
				})
			}
		}
	}
	t.Logf("%d (GPU, profile) answers checked against the allocator, %d of them above zero", checked, nonzero)
}

// stillAllocatable asks the allocator whether exactly p.Allocatable more
// devices of p's profile fit on the GPU, and says how not, if not.
//
// A claim for n+1 devices that cannot be met makes the allocator try every
// subset of the candidates up to that size: fine for MIG placements (at
// most 8 per profile), exponential for many interchangeable devices. Where
// the profile's devices cost the same and declare the same groups (checked
// here: time-sliced vGPU blocks), any n instances are as good as any
// other: n+1 fit together exactly when one more fits beside the n the
// allocator picks. Instances of a block that claims share are asked one
// request each.
func stillAllocatable(t *testing.T, a *allocate.Allocator, objs []resourceapi.ResourceSlice, bus string, p Profile) string {
	n := int64(p.Allocatable)
	placed, same, shared := candidates(objs, bus, p.Profile)
	if placed || !same {
		if n > 0 {
			c := claimFor(bus, p.Profile, n)
			if !fits(t, a, c) {
				return "the allocator refuses that many"
			}
			a.Release(c)
		}
		if fits(t, a, claimFor(bus, p.Profile, n+1)) {
			return "the allocator allocates one more"
		}
		return ""
	}
	ask := claimFor
	if shared {
		ask = sharesFor
	}
	var taken *resourceapi.ResourceClaim
	if n > 0 {
		taken = ask(bus, p.Profile, n)
		if !fits(t, a, taken) {
			return "the allocator refuses that many"
		}
		defer a.Release(taken)
	}
	if one := ask(bus, p.Profile, 1); fits(t, a, one) {
		a.Release(one)
		return "the allocator allocates one more"
	}
	return ""
}

// candidates reports whether the profile's devices on the GPU have
// placements, whether they all consume the same counters with the same
// groups and carry the same taints (interchangeable), and whether claims
// share them.
func candidates(objs []resourceapi.ResourceSlice, bus, prof string) (placed, same, shared bool) {
	same = true
	first := ""
	for _, s := range objs {
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			if stringAttr(d, attrPCIBusID) != bus || stringAttr(d, attrProfile) != prof {
				continue
			}
			if _, ok := placement(d); ok {
				placed = true
			}
			shared = shared || d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
			key := fmt.Sprint(d.ConsumesCounters, d.Taints)
			if first == "" {
				first = key
			}
			same = same && key == first
		}
	}
	return placed, same, shared
}

// partitionFault faults the first placement of the GPU's first MIG
// profile, which taints the devices at exactly that placement.
func partitionFault(g hw.GPU) hw.Health {
	for _, p := range g.MIG.Profiles {
		if len(p.Placements) > 0 {
			return hw.Health{Partitions: map[hw.PartitionRef]hw.Fault{
				{GPU: g.PCIBusID, Placement: p.Placements[0]}: {Reason: "XID94", Message: "test"},
			}}
		}
	}
	return hw.Health{GPUs: map[string]hw.Fault{g.PCIBusID: {Reason: "XID79", Message: "test"}}}
}

// profilesOf lists the profiles published on one GPU.
func profilesOf(objs []resourceapi.ResourceSlice, bus string) []string {
	var out []string
	for _, s := range objs {
		for _, d := range s.Spec.Devices {
			if stringAttr(&d, attrPCIBusID) == bus && !slices.Contains(out, stringAttr(&d, attrProfile)) {
				out = append(out, stringAttr(&d, attrProfile))
			}
		}
	}
	return out
}

func heldDevices(held []*resourceapi.ResourceClaim) []string {
	var out []string
	for _, c := range held {
		for _, r := range c.Status.Allocation.Devices.Results {
			out = append(out, r.Device)
		}
	}
	return out
}
