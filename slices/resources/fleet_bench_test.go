package resources

import (
	"context"
	"fmt"
	"testing"

	"github.com/hwdra/hwdra/slices/device"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/hwdra/hwdra/allocate"
	"github.com/hwdra/hwdra/deploy"
)

// BenchmarkFleetAllocation is the scheduler's cost of our device model
// across a fleet: per pod the scheduler builds one allocator over every
// ResourceSlice in the cluster and runs it for each candidate node
// (the DRA plugin's Filter). Nodes are mock DGX H100s (8 GPUs: 208 GPU
// devices with counters), beside the simplest model of the same hardware,
// one device per GPU without counters (8 devices, our fallback without
// DRAPartitionableDevices), and beside our devices laid out as one pool
// per GPU (the layout a partition summary would need, see
// pooldesign_test.go). Reported per node: ns/node and allocs/node.
//
//	go test -run '^$' -bench Fleet -benchmem ./slices/
func BenchmarkFleetAllocation(b *testing.B) {
	gpus := probe(b, "mock:dgx-h100").GPUs
	classes, err := deploy.DeviceClasses()
	if err != nil {
		b.Fatal(err)
	}
	lister := allocate.ClassLister(classes)
	// request takes the class name where it says driver.
	claims := map[string]*resourceapi.ResourceClaim{
		"full-gpu": claim(request("gpu", "gpu.hwdra.io", 1, "")),
		"1g.10gb":  claim(request("mig", "mig.gpu.hwdra.io", 1, `device.attributes["gpu.hwdra.io"].profile == "1g.10gb"`)),
	}
	nodePool := func(f device.Features) []resourceapi.ResourceSlice {
		return Objects(device.GPUDriver, "node", GPU("node", gpus, f))
	}
	models := []struct {
		name   string
		slices []resourceapi.ResourceSlice
		claims []string
	}{
		{"hwdra", nodePool(device.AllFeatures), []string{"full-gpu", "1g.10gb"}},
		{"one-device-per-GPU", nodePool(device.Features{}), []string{"full-gpu"}},
		{"pools-per-GPU", perGPUPools("node", GPU("node", gpus, device.AllFeatures)), []string{"full-gpu", "1g.10gb"}},
	}
	celCache := cel.NewCache(1000, cel.Features{EnableConsumableCapacity: true})
	for _, m := range models {
		// One node's slices; the fleet's share their devices (the
		// allocator only reads them), so 1000 nodes fit in memory.
		one := m.slices
		for _, n := range []int{1, 100, 1000} {
			slices, nodes := fleet(one, n)
			for _, name := range m.claims {
				b.Run(fmt.Sprintf("%s/%s/nodes=%d", m.name, name, n), func(b *testing.B) {
					ctx := context.Background()
					state := allocate.EmptyState()
					claims := []*resourceapi.ResourceClaim{claims[name]}
					b.ReportAllocs()
					for b.Loop() {
						a, err := structured.NewAllocator(ctx, allocate.ClusterFeatures, state, lister, slices, celCache)
						if err != nil {
							b.Fatal(err)
						}
						for _, node := range nodes {
							res, err := a.Allocate(ctx, node, claims)
							if err != nil || len(res) != 1 {
								b.Fatalf("node %s: %v %v", node.Name, res, err)
							}
						}
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/node")
				})
			}
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
