// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"context"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/agent/slices/device"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/hwdra/hwdra/deploy"
	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// fleetClaims are the claims the fleet benchmark allocates, by kind, with
// the shipped DeviceClasses (request takes the class name where it says
// driver); oneDeviceClaims what each kind asks for in the one-device model
// (a whole GPU, or a whole VF).
var fleetClaims = map[string]func() *resourceapi.ResourceClaim{
	"full-gpu": func() *resourceapi.ResourceClaim { return claim(request("gpu", "gpu.hwdra.io", 1, "")) },
	"1g.10gb": func() *resourceapi.ResourceClaim {
		return claim(request("mig", "mig.gpu.hwdra.io", 1, `device.attributes["gpu.hwdra.io"].profile == "1g.10gb"`))
	},
	"3g.40gb": func() *resourceapi.ResourceClaim {
		return claim(request("mig", "mig.gpu.hwdra.io", 1, `device.attributes["gpu.hwdra.io"].profile == "3g.40gb"`))
	},
	"gpu-share": func() *resourceapi.ResourceClaim {
		return claim(capacityRequest("share", "share.gpu.hwdra.io", map[string]string{"gpu.hwdra.io/memory": "20Gi", "gpu.hwdra.io/compute": "40"}))
	},
	"vf-share": func() *resourceapi.ResourceClaim {
		return claim(capacityRequest("vf", "vf-share.sriov.hwdra.io", map[string]string{"sriov.hwdra.io/bandwidth": "10G"}))
	},
}

var oneDeviceClaims = map[string]func() *resourceapi.ResourceClaim{
	"gpu": fleetClaims["full-gpu"],
	"vf":  func() *resourceapi.ResourceClaim { return claim(request("vf", "vf.sriov.hwdra.io", 1, "")) },
}

// capacityRequest asks for one device of a class with capacity requests.
func capacityRequest(name, class string, capacity map[string]string) resourceapi.DeviceRequest {
	r := request(name, class, 1, "")
	r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
	for k, v := range capacity {
		r.Exactly.Capacity.Requests[resourceapi.QualifiedName(k)] = resource.MustParse(v)
	}
	return r
}

// leanMIG is an AgentConfig that offers the MIG profiles most claims ask
// for and leaves out the variants (docs/design.md, "What the scheduler pays").
const leanMIG = `apiVersion: config.hwdra.io/v1alpha1
kind: AgentConfig
gpus:
  migProfiles:
    include: ["1g.*", 3g.40gb, 7g.80gb]
    exclude: ["*+me*", 1g.20gb]
`

// fleetModel is one way of publishing a DGX H100 (8 GPUs, 10 ConnectX-7
// PFs) for the fleet benchmark, with the kinds measured on it.
type fleetModel struct {
	name    string
	slices  []resourceapi.ResourceSlice
	classes []*resourceapi.DeviceClass
	kinds   []string
}

// fleetModels: "default" is what the agent publishes without a
// configuration (168 GPU devices and 10 shared PFs), "lean" gpus.migProfiles
// of leanMIG (80 GPU devices), and two alternatives measured, not
// published: "pools-per-GPU" (the default's GPU devices as one pool per
// GPU, see pooldesign_test.go) and "nic-first" (the NIC driver renamed so
// that it sorts before the GPU driver, as the allocator visits pools by
// driver name: what a rename would buy a VF share).
func fleetModels(b *testing.B, inv hw.Inventory, classes []*resourceapi.DeviceClass) []fleetModel {
	lean, err := config.Parse([]byte(leanMIG))
	if err != nil {
		b.Fatal(err)
	}
	node := func(cfg *config.AgentConfig) []resourceapi.ResourceSlice {
		res, _ := ForNode("node", inv, cfg, device.AllFeatures, hw.Health{})
		return append(Objects(device.GPUDriver, "node", res[device.GPUDriver]), Objects(device.NICDriver, "node", res[device.NICDriver])...)
	}
	def := node(config.Default())
	res, _ := ForNode("node", inv, config.Default(), device.AllFeatures, hw.Health{})
	perGPU := append(perGPUPools("node", res[device.GPUDriver]), Objects(device.NICDriver, "node", res[device.NICDriver])...)
	gpuKinds := []string{"full-gpu", "1g.10gb", "3g.40gb", "gpu-share"}
	return []fleetModel{
		{"default", def, classes, append(gpuKinds, "vf-share")},
		{"lean", node(lean), classes, append(gpuKinds, "vf-share")},
		{"pools-per-GPU", perGPU, classes, []string{"full-gpu", "1g.10gb", "gpu-share"}},
		{"nic-first", renameDriver(def, device.NICDriver, nicFirstDriver), renameClasses(classes, device.NICDriver, nicFirstDriver), []string{"vf-share"}},
	}
}

// nicFirstDriver sorts before gpu.hwdra.io.
const nicFirstDriver = "dra-sriov.hwdra.io"

// BenchmarkFleetAllocation is the scheduler's cost of our device model
// across a fleet: per pod the scheduler builds one allocator over every
// ResourceSlice in the cluster and runs it for each candidate node (the
// DRA plugin's Filter). Nodes are mock DGX H100s (8 GPUs, MIG off as
// shipped, which Hopper switches without a reset, so every MIG partition
// is offered too; 10 ConnectX-7 PFs) with both drivers' slices. Each run
// allocates a kind with our slices and, in the same loop, the simplest
// model of the same hardware, one device per GPU and per VF without
// counters (our fallback without DRAPartitionableDevices): a whole GPU for
// the GPU kinds, a whole VF for a VF share. cpu-ns/node is ours,
// one-device-cpu-ns/node the simplest model's (the benchmark thread's CPU
// time, which other load on the machine leaves alone), x-one-device their
// ratio.
//
// shares=N: N shares already allocated elsewhere in the cluster (half GPU
// shares, half VF shares, on other nodes' devices), and in the one-device
// model the same claims as whole GPUs and VFs. The allocator scans every
// shared allocation of the cluster once per device of each pool with
// counters it looks at (IsDeviceAllocated, twice with compatibility
// groups), so a fleet full of shares slows every GPU claim on our slices.
//
//	go test -run '^$' -bench FleetAllocation -benchtime=3x ./internal/agent/slices/resources/
func BenchmarkFleetAllocation(b *testing.B) {
	inv := probe(b, "mock:dgx-h100")
	classes, err := deploy.DeviceClasses()
	if err != nil {
		b.Fatal(err)
	}
	offers, _ := config.Default().Resolve(inv.PFs)
	nic, _ := NIC("node", offers, device.Features{})
	simplest := append(Objects(device.GPUDriver, "node", GPU("node", inv.GPUs, device.Features{})), Objects(device.NICDriver, "node", nic)...)
	cc := cel.NewCache(1000, cel.Features{EnableConsumableCapacity: true})
	oneLister := allocate.ClassLister(classes)
	for _, shares := range []int{0, 5000} {
		ourState, oneState := sharesInUse(shares, false), sharesInUse(shares, true)
		for _, n := range []int{1, 100, 1000} {
			if shares > 0 && n > 100 {
				continue // linear in nodes; 1000 nodes would take minutes per run
			}
			one, oneNodes := fleet(simplest, n)
			for _, m := range fleetModels(b, inv, classes) {
				ours, nodes := fleet(m.slices, n)
				r := fleetRunner{lister: allocate.ClassLister(m.classes), cel: cc, state: ourState, cache: newPoolCache()}
				oneR := fleetRunner{lister: oneLister, cel: cc, state: oneState, cache: newPoolCache()}
				for _, kind := range m.kinds {
					oneKind := "gpu"
					if kind == "vf-share" {
						oneKind = "vf"
					}
					b.Run(fmt.Sprintf("%s/%s/%s/nodes=%d/shares=%d", allocatorVariant, m.name, kind, n, shares), func(b *testing.B) {
						// The thread's CPU time, not the wall clock: other
						// work on a shared machine does not count.
						runtime.LockOSThread()
						defer runtime.UnlockOSThread()
						var tOurs, tOne time.Duration
						// A warm scheduler: CEL compiled (and with the
						// patched allocator, the pools cached) by
						// earlier pods.
						r.allocate(b, ours, nodes, fleetClaims[kind]())
						oneR.allocate(b, one, oneNodes, oneDeviceClaims[oneKind]())
						b.ReportAllocs()
						// Labelled so that a CPU profile tells the two
						// apart (-cpuprofile, then pprof -tagfocus model=ours).
						ourLabels, oneLabels := pprof.Labels("model", "ours", "kind", kind), pprof.Labels("model", "one-device", "kind", oneKind)
						for b.Loop() {
							start := threadCPU(b)
							pprof.Do(context.Background(), ourLabels, func(context.Context) { r.allocate(b, ours, nodes, fleetClaims[kind]()) })
							mid := threadCPU(b)
							pprof.Do(context.Background(), oneLabels, func(context.Context) { oneR.allocate(b, one, oneNodes, oneDeviceClaims[oneKind]()) })
							tOurs, tOne = tOurs+mid-start, tOne+threadCPU(b)-mid
						}
						perNode := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) / float64(n) }
						b.ReportMetric(perNode(tOurs), "cpu-ns/node")
						b.ReportMetric(perNode(tOne), "one-device-cpu-ns/node")
						b.ReportMetric(float64(tOurs)/float64(tOne), "x-one-device")
					})
				}
			}
		}
	}
}

// sharesInUse is the allocated state of a cluster where n shares are
// allocated on other nodes than the benchmark's: half GPU shares (ten per
// GPU share device), half VF shares (ten per PF). With oneDevice, each is
// a whole GPU or VF instead, as the one-device model allocates them.
func sharesInUse(n int, oneDevice bool) structured.AllocatedState {
	s := allocate.EmptyState()
	for i := range n {
		pool := fmt.Sprintf("elsewhere-%05d", i/160)
		id := structured.MakeDeviceID(device.GPUDriver, pool, device.ShareName(fmt.Sprintf("0000:%02x:00.0", i/10%8)))
		if oneDevice {
			id = structured.MakeDeviceID(device.GPUDriver, pool, fmt.Sprintf("gpu-%d", i))
		}
		if i%2 == 1 {
			id = structured.MakeDeviceID(device.NICDriver, pool, device.NICDeviceName(fmt.Sprintf("0000:%02x:00.0", i/10%10)))
			if oneDevice {
				id = structured.MakeDeviceID(device.NICDriver, pool, fmt.Sprintf("vf-%d", i))
			}
		}
		if oneDevice {
			s.AllocatedDevices.Insert(id)
			continue
		}
		uid := types.UID(fmt.Sprintf("share-%d", i))
		s.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, &uid))
		s.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id,
			map[resourceapi.QualifiedName]resource.Quantity{device.GPUCapMemory: resource.MustParse("4Gi")}))
	}
	return s
}

// renameDriver is one driver's slices published under another name, its
// attributes and capacities keeping their names.
func renameDriver(in []resourceapi.ResourceSlice, from, to string) []resourceapi.ResourceSlice {
	out := make([]resourceapi.ResourceSlice, 0, len(in))
	for _, s := range in {
		if s.Spec.Driver == from {
			s = *s.DeepCopy()
			s.Spec.Driver = to
		}
		out = append(out, s)
	}
	return out
}

// renameClasses are the classes with their selectors on driver from
// testing driver to instead.
func renameClasses(in []*resourceapi.DeviceClass, from, to string) []*resourceapi.DeviceClass {
	out := make([]*resourceapi.DeviceClass, 0, len(in))
	for _, c := range in {
		c = c.DeepCopy()
		for i := range c.Spec.Selectors {
			e := c.Spec.Selectors[i].CEL
			e.Expression = strings.ReplaceAll(e.Expression, fmt.Sprintf("device.driver == %q", from), fmt.Sprintf("device.driver == %q", to))
		}
		out = append(out, c)
	}
	return out
}

// threadCPU is the CPU time of the calling thread.
func threadCPU(b *testing.B) time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ts.Nano())
}

// fleetRunner allocates as the scheduler does for one pod: one allocator
// over the cluster's slices, run for each node.
type fleetRunner struct {
	lister structured.DeviceClassLister
	cel    *cel.Cache
	state  structured.AllocatedState
	cache  poolCache
}

func (r fleetRunner) allocate(b *testing.B, slices []*resourceapi.ResourceSlice, nodes []*v1.Node, c *resourceapi.ResourceClaim) {
	ctx := context.Background()
	a, err := r.cache.newAllocator(ctx, r.state, r.lister, slices, r.cel)
	if err != nil {
		b.Fatal(err)
	}
	claims := []*resourceapi.ResourceClaim{c}
	for _, node := range nodes {
		res, err := a.Allocate(ctx, node, claims)
		if err != nil || len(res) != 1 {
			b.Fatalf("node %s: %v %v", node.Name, res, err)
		}
	}
}

// fleet copies one node's slices to n nodes, sharing their devices.
func fleet(one []resourceapi.ResourceSlice, n int) ([]*resourceapi.ResourceSlice, []*v1.Node) {
	var slices []*resourceapi.ResourceSlice
	var nodes []*v1.Node
	for i := range n {
		name := fmt.Sprintf("node-%04d", i)
		nodes = append(nodes, allocate.Node(name))
		for _, s := range one {
			s.Name = fmt.Sprintf("%s-%s", name, s.Name)
			s.Spec.NodeName = &name
			s.Spec.Pool.Name = fleetPool(name, s.Spec.Pool.Name)
			slices = append(slices, &s)
		}
	}
	return slices, nodes
}

// BenchmarkRefusal is the scheduler's cost, per node, of refusing one
// request for one device more of a kind than the node holds (the goal:
// under a second). Nodes have 8 GPUs: a DGX H100 (MIG off, switchable,
// GPU shares offered); 8 H100s in host-vGPU mode with one time-sliced
// size at a time ("vgpu") and mixed ("vgpu-mixed"); and the DGX H100's
// NICs in shared mode.
//
//	go test -run '^$' -bench Refusal ./internal/agent/slices/resources/
func BenchmarkRefusal(b *testing.B) {
	gpuNode := func(yaml string) ByDriver {
		return ByDriver{device.GPUDriver: mockGPUPool(b, "h100-80gb", yaml, 8)}
	}
	nics, _ := NIC(testNode, offer(config.ModeShared, probe(b, "mock:dgx-h100").PFs...), device.AllFeatures)
	for _, node := range []struct {
		name  string
		res   ByDriver
		kinds []kind
	}{
		{"dgx-h100", gpuNode(""), []kind{
			{driver: device.GPUDriver, typ: device.KindGPU, profile: device.ProfileFull},
			{driver: device.GPUDriver, typ: device.KindMIG, profile: "1g.10gb+me"},
			{driver: device.GPUDriver, typ: device.KindMIG, profile: "3g.40gb"},
			{driver: device.GPUDriver, typ: device.KindMIG, profile: "4g.40gb"},
			{driver: device.GPUDriver, typ: device.KindShare, profile: device.ProfileShare, shared: true},
		}},
		{"vgpu", gpuNode(gpuModes[2].yaml), []kind{
			{driver: device.GPUDriver, typ: device.KindVGPU, profile: "H100-8C", shared: true},
			{driver: device.GPUDriver, typ: device.KindVGPU, profile: "H100-80C"},
		}},
		{"vgpu-mixed", gpuNode(gpuModes[3].yaml), []kind{
			{driver: device.GPUDriver, typ: device.KindVGPU, profile: "H100-8C", shared: true},
			{driver: device.GPUDriver, typ: device.KindVGPU, profile: "H100-40C"},
		}},
		{"dgx-h100-nics", ByDriver{device.NICDriver: nics}, []kind{
			{driver: device.NICDriver, typ: "nic", profile: string(config.ModeShared), shared: true},
		}},
	} {
		for _, k := range node.kinds {
			newAlloc := func() *allocate.Allocator { return newAllocator(b, allocate.ClusterFeatures, node.res) }
			c := countKind(b, newAlloc, node.res[k.driver], k)
			b.Run(fmt.Sprintf("%s/%s/%d-of-%d", node.name, k.profile, c.total()+1, c.total()), func(b *testing.B) {
				for b.Loop() {
					fits, _, err := allocateWithin(newAlloc(), claim(request("all", k.driver, int64(c.total()+1), k.selector())))
					if err != nil || fits {
						b.Fatalf("%s: fits %v, %v", k, fits, err)
					}
				}
			})
		}
	}
}

// BenchmarkFleetRefusal is what a claim that fits an empty node but not the
// node as it is used costs one Filter: a DGX H100 as the agent publishes it
// by default, one 3g.40gb in use on its first GPU, then a claim for 24 x
// 2g.20gb (23 fit) or 25 (24 would fit an empty node), within the
// scheduler's filter timeout of 10 s. cpu-ms/node is the Filter's CPU time
// (the thread's), undecided-in-10s the share of Filters that ran into the
// timeout.
//
//	go test -run '^$' -bench FleetRefusal -benchtime=3x ./internal/agent/slices/resources/
func BenchmarkFleetRefusal(b *testing.B) {
	inv := probe(b, "mock:dgx-h100")
	classes, err := deploy.DeviceClasses()
	if err != nil {
		b.Fatal(err)
	}
	res, _ := ForNode("node", inv, config.Default(), device.AllFeatures, hw.Health{})
	slices, nodes := fleet(append(Objects(device.GPUDriver, "node", res[device.GPUDriver]), Objects(device.NICDriver, "node", res[device.NICDriver])...), 1)
	state := allocate.EmptyState()
	first := inv.GPUs[0].PCIBusID
	for _, g := range inv.GPUs {
		first = min(first, g.PCIBusID)
	}
	state.AllocatedDevices.Insert(structured.MakeDeviceID(device.GPUDriver, *slices[0].Spec.NodeName, device.MIGName(first, "3g.40gb", 4)))
	r := fleetRunner{lister: allocate.ClassLister(classes), cel: cel.NewCache(1000, cel.Features{EnableConsumableCapacity: true}), state: state, cache: newPoolCache()}
	for _, count := range []int64{24, 25} {
		b.Run(fmt.Sprintf("%s/%dx2g.20gb-beside-3g.40gb", allocatorVariant, count), func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			c := func() *resourceapi.ResourceClaim {
				return claim(request("mig", "mig.gpu.hwdra.io", count, `device.attributes["gpu.hwdra.io"].profile == "2g.20gb"`))
			}
			var cpu time.Duration
			undecided := 0
			for b.Loop() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				a, err := r.cache.newAllocator(ctx, r.state, r.lister, slices, r.cel)
				if err != nil {
					b.Fatal(err)
				}
				start := threadCPU(b)
				got, err := a.Allocate(ctx, nodes[0], []*resourceapi.ResourceClaim{c()})
				cpu += threadCPU(b) - start
				if ctx.Err() != nil {
					undecided++
				}
				cancel()
				if len(got) != 0 || err != nil && ctx.Err() == nil {
					b.Fatalf("%d x 2g.20gb beside a 3g.40gb: %v, %v", count, got, err)
				}
			}
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/node")
			b.ReportMetric(float64(undecided)/float64(b.N), "undecided-in-10s")
		})
	}
}
