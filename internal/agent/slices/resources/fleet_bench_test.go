// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/agent/slices/device"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/hwdra/hwdra/deploy"
	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// fleetClaims are the claims the fleet benchmark allocates, by kind, with
// the shipped DeviceClasses (request takes the class name where it says
// driver).
var fleetClaims = map[string]*resourceapi.ResourceClaim{
	"full-gpu": claim(request("gpu", "gpu.hwdra.io", 1, "")),
	"1g.10gb":  claim(request("mig", "mig.gpu.hwdra.io", 1, `device.attributes["gpu.hwdra.io"].profile == "1g.10gb"`)),
	"3g.40gb":  claim(request("mig", "mig.gpu.hwdra.io", 1, `device.attributes["gpu.hwdra.io"].profile == "3g.40gb"`)),
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

// BenchmarkFleetAllocation is the scheduler's cost of our device model
// across a fleet: per pod the scheduler builds one allocator over every
// ResourceSlice in the cluster and runs it for each candidate node (the
// DRA plugin's Filter). Nodes are mock DGX H100s (8 GPUs; MIG off as
// shipped, which Hopper switches without a reset, so every MIG partition
// is offered too: 168 GPU devices by default). Each run allocates a kind
// with our slices and, in the same loop, a whole GPU with the simplest
// model of the same hardware, one device per GPU without counters (our
// fallback without DRAPartitionableDevices), so both see the same load:
// cpu-ns/node is ours, one-device-cpu-ns/node the simplest model's (the
// benchmark thread's CPU time, which other load on the machine leaves
// alone), x-one-device their ratio. Models: "default" (what the agent
// publishes without a configuration), "lean" (gpus.migProfiles of
// leanMIG: 1g.10gb, 3g.40gb and 7g.80gb, 80 devices), and the default's devices laid out as one
// pool per GPU (the layout a partition summary would need, see
// pooldesign_test.go).
//
//	go test -run '^$' -bench Fleet -benchmem ./internal/agent/slices/resources/
func BenchmarkFleetAllocation(b *testing.B) {
	gpus := probe(b, "mock:dgx-h100").GPUs
	classes, err := deploy.DeviceClasses()
	if err != nil {
		b.Fatal(err)
	}
	lean, err := config.Parse([]byte(leanMIG))
	if err != nil {
		b.Fatal(err)
	}
	leanRes, _ := ForNode("node", hw.Inventory{GPUs: gpus}, lean, device.AllFeatures, hw.Health{})
	models := []struct {
		name   string
		slices []resourceapi.ResourceSlice
		kinds  []string
	}{
		{"default", Objects(device.GPUDriver, "node", GPU("node", gpus, device.AllFeatures)), []string{"full-gpu", "1g.10gb", "3g.40gb"}},
		{"lean", Objects(device.GPUDriver, "node", leanRes[device.GPUDriver]), []string{"full-gpu", "1g.10gb", "3g.40gb"}},
		{"pools-per-GPU", perGPUPools("node", GPU("node", gpus, device.AllFeatures)), []string{"full-gpu", "1g.10gb"}},
	}
	simplest := Objects(device.GPUDriver, "node", GPU("node", gpus, device.Features{}))
	r := fleetRunner{lister: allocate.ClassLister(classes), cel: cel.NewCache(1000, cel.Features{EnableConsumableCapacity: true})}
	for _, n := range []int{1, 100, 1000} {
		one, oneNodes := fleet(simplest, n)
		for _, m := range models {
			ours, nodes := fleet(m.slices, n)
			for _, kind := range m.kinds {
				b.Run(fmt.Sprintf("%s/%s/nodes=%d", m.name, kind, n), func(b *testing.B) {
					// The thread's CPU time, not the wall clock: other
					// work on a shared machine does not count.
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					var tOurs, tOne time.Duration
					b.ReportAllocs()
					for b.Loop() {
						start := threadCPU(b)
						r.allocate(b, ours, nodes, fleetClaims[kind])
						mid := threadCPU(b)
						r.allocate(b, one, oneNodes, fleetClaims["full-gpu"])
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
}

func (r fleetRunner) allocate(b *testing.B, slices []*resourceapi.ResourceSlice, nodes []*v1.Node, c *resourceapi.ResourceClaim) {
	ctx := context.Background()
	a, err := structured.NewAllocator(ctx, allocate.ClusterFeatures, allocate.EmptyState(), r.lister, slices, r.cel)
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
