// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"testing"

	"github.com/hwdra/hwdra/internal/agent/slices/device"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// TestGPUAndVFShareOnOneNUMANode: on a mock DGX H100, a claim for a whole GPU
// and a VF bandwidth share with matchAttribute on the NUMA node lands both on
// one node; once node 0's GPUs are taken it lands both on node 1.
func TestGPUAndVFShareOnOneNUMANode(t *testing.T) {
	res, _ := ForNode(testNode, probe(t, "mock:dgx-h100"), config.Default(), device.AllFeatures, hw.Health{})
	a := newAllocator(t, allocate.ClusterFeatures, res)
	numaOf := map[string]int64{}
	for _, r := range res {
		for name, d := range devicesByName(r) {
			if v, ok := d.Attributes["resource.kubernetes.io/numaNode"]; ok {
				numaOf[name] = *v.IntValue
			}
		}
	}
	pair := func() *resourceapi.ResourceClaim {
		c := claim(profile("gpu", device.ProfileFull, 1), share("nic", "50G"))
		c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{
			MatchAttribute: new(resourceapi.FullyQualifiedName("resource.kubernetes.io/numaNode")),
		}}
		return c
	}
	// Eight GPUs, four per node: eight pairs fit, each on one node.
	perNode := map[int64]int{}
	for i := 0; i < 8; i++ {
		c := pair()
		if !fits(t, a, c) {
			t.Fatalf("pair %d refused", i+1)
		}
		devs := allocatedDevices(c)
		gpu, nic := numaOf[devs[0]], numaOf[devs[1]]
		if gpu != nic {
			t.Fatalf("pair %d: GPU %s on NUMA %d, NIC %s on NUMA %d", i+1, devs[0], gpu, devs[1], nic)
		}
		perNode[gpu]++
	}
	if perNode[0] != 4 || perNode[1] != 4 {
		t.Fatalf("pairs per NUMA node: %v", perNode)
	}
	if fits(t, a, pair()) {
		t.Fatal("ninth GPU allocated")
	}
}
