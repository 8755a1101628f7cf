// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/mock/model"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// The GPU pool declares no partitionTypeAttribute (docs/design.md,
// "Pool status and partition types"). The pool-status controller (k8s v1.37
// pkg/controller/resourcepoolstatusrequest) summarises a partition type
// only when every device of that type in a pool consumes identical
// counters, counter-set names included, and at most 32 types per pool.
// These measure the one layout that could satisfy it without giving up the
// memory-slice counters: one pool per GPU whose partition types are the
// device's exact cost, i.e. (profile, placement).

// maxPartitionTypes is the controller's limit on types per pool.
const maxPartitionTypes = 32

// perGPUPools lays a node's GPU pool out as one pool per GPU (counter
// set), named "<node>-<counter set>", each with its counter set and the
// devices that consume it, within the same per-slice limits.
func perGPUPools(nodeName string, res resourceslice.DriverResources) []resourceapi.ResourceSlice {
	sets := map[string]resourceapi.CounterSet{}
	devices := map[string][]resourceapi.Device{}
	for _, s := range res.Pools[nodeName].Slices {
		for _, cs := range s.SharedCounters {
			sets[cs.Name] = cs
		}
		for _, d := range s.Devices {
			set := ""
			if len(d.ConsumesCounters) > 0 {
				set = d.ConsumesCounters[0].CounterSet
			}
			devices[set] = append(devices[set], d)
		}
	}
	var out []resourceapi.ResourceSlice
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range devices {
			if !yield(k) {
				return
			}
		}
	}) {
		var counters []resourceapi.CounterSet
		if cs, ok := sets[name]; ok {
			counters = []resourceapi.CounterSet{cs}
		}
		poolName := nodeName + "-" + name
		objs := Objects(device.GPUDriver, nodeName, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
			poolName: pool(counters, devices[name]),
		}})
		for i := range objs {
			objs[i].Name = poolName + "-" + objs[i].Name
		}
		out = append(out, objs...)
	}
	return out
}

// costKey is a device's counter cost as the controller compares costs.
func costKey(d resourceapi.Device) string {
	var parts []string
	for _, c := range d.ConsumesCounters {
		for name, v := range c.Counters {
			parts = append(parts, c.CounterSet+"/"+name+"="+v.Value.String())
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// TestPartitionTypeAlternatives measures, for every GPU model in each mode
// on an 8-GPU node: how many slices the node's pool takes now and as pools
// per GPU; how many distinct costs (the partition types a per-GPU pool
// would need) one GPU has; and that one profile costs differently across
// the node's pool, so "profile" cannot be the node pool's partition type.
// It fails where design.md's reasons stop holding.
//
//	go test -run TestPartitionTypeAlternatives -v ./internal/agent/slices/
func TestPartitionTypeAlternatives(t *testing.T) {
	for _, model := range model.GPUNames() {
		for _, mode := range gpuModes[:3] { // mixed vGPU sizes change nothing here
			name := model + "/" + mode.name
			res := mockGPUPool(t, model, mode.yaml, 8)
			now := len(res.Pools[testNode].Slices)
			split := len(perGPUPools(testNode, res))

			costsPerGPU := map[string]map[string]bool{}
			costsPerProfile := map[string]map[string]bool{}
			devicesPerGPU := map[string]int{}
			for _, s := range res.Pools[testNode].Slices {
				for _, d := range s.Devices {
					if len(d.ConsumesCounters) == 0 {
						continue
					}
					gpu, cost, prof := d.ConsumesCounters[0].CounterSet, costKey(d), *d.Attributes[device.AttrProfile].StringValue
					if costsPerGPU[gpu] == nil {
						costsPerGPU[gpu] = map[string]bool{}
					}
					if costsPerProfile[prof] == nil {
						costsPerProfile[prof] = map[string]bool{}
					}
					costsPerGPU[gpu][cost] = true
					costsPerProfile[prof][cost] = true
					devicesPerGPU[gpu]++
				}
			}
			maxTypes, maxDevices := 0, 0
			for gpu, c := range costsPerGPU {
				maxTypes = max(maxTypes, len(c))
				maxDevices = max(maxDevices, devicesPerGPU[gpu])
			}
			mixed := 0
			for _, c := range costsPerProfile {
				if len(c) > 1 {
					mixed++
				}
			}
			t.Logf("%-22s slices/node %2d now, %2d as pools per GPU; per GPU %3d devices, %2d distinct costs; %d of %d profiles cost differently across the node",
				name, now, split, maxDevices, maxTypes, mixed, len(costsPerProfile))
			if len(costsPerProfile) > 0 && mixed == 0 {
				t.Errorf("%s: every profile costs the same across the node's pool: a partition type could be published", name)
			}
			if len(costsPerGPU) > 0 && split <= now {
				t.Errorf("%s: pools per GPU take %d slices, not more than the node pool's %d", name, split, now)
			}
			// Since the counters carry only what decides something
			// (gpucounters.go), a GPU has few enough costs for one pool
			// per GPU to fit the controller's limit on types.
			if maxTypes > maxPartitionTypes {
				t.Errorf("%s: a GPU has %d distinct costs, above the controller's %d", name, maxTypes, maxPartitionTypes)
			}
		}
	}
}

// fleetPool renames one node's pool for node name, keeping per-GPU pools
// apart.
func fleetPool(node, pool string) string {
	return node + strings.TrimPrefix(pool, "node")
}
