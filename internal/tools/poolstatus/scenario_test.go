// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package poolstatus

import (
	"bytes"
	"context"
	"regexp"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hwdra/hwdra/deploy"
	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/tools/allocate"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
)

// TestDGXScenario: on a mock DGX H100 as the agent publishes it, three
// 1g.10gb on one GPU, two shares of 10Gi and 20% of another, and two 150G
// shares of one 400G PF, allocated by the scheduler's allocator with the
// shipped DeviceClasses. The report says 4 more 1g.10gb fit on the first
// GPU (7 placements, 3 used), what else fits beside them, and that it
// takes no share; that the second GPU's shares consume 20Gi and 40%, 60Gi
// and 60% are left (6 more of the default size) and nothing else fits
// there; nothing changed on the others; 100G left on that PF, 300G
// consumed in the pool; and the table says so.
func TestDGXScenario(t *testing.T) {
	inv, err := probe(t, "dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	res, _ := resources.ForNode(node, inv, config.Default(), device.AllFeatures, hw.Health{})
	var objs []resourceapi.ResourceSlice
	for _, d := range []string{device.GPUDriver, device.NICDriver} {
		objs = append(objs, resources.Objects(d, node, res[d])...)
	}
	ptrs := make([]*resourceapi.ResourceSlice, len(objs))
	for i := range objs {
		ptrs[i] = &objs[i]
	}
	classes, err := deploy.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	a := allocate.New(allocate.ClusterFeatures, node, ptrs, classes)
	const gpu, shareGPU, pf = "0000:1b:00.0", "0000:43:00.0", "0000:18:00.0"
	mig := claimFor(gpu, "1g.10gb", 3)
	mig.Spec.Devices.Requests[0].Exactly.DeviceClassName = "mig.gpu.hwdra.io"
	claims := []*resourceapi.ResourceClaim{mig}
	for range 2 {
		share := claimFor("", "", 1)
		share.Spec.Devices.Requests[0] = allocate.Request("r", "vf-share.sriov.hwdra.io", 1, `device.attributes["sriov.hwdra.io"].pfPciAddress == "`+pf+`"`)
		share.Spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{
			Requests: map[resourceapi.QualifiedName]resource.Quantity{device.NICCapBandwidth: resource.MustParse("150G")},
		}
		claims = append(claims, share)
	}
	for range 2 {
		share := claimFor(shareGPU, "share", 1)
		share.Spec.Devices.Requests[0].Exactly.DeviceClassName = "share.gpu.hwdra.io"
		share.Spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{
			Requests: map[resourceapi.QualifiedName]resource.Quantity{device.GPUCapMemory: resource.MustParse("10Gi"), device.GPUCapCompute: resource.MustParse("20")},
		}
		claims = append(claims, share)
	}
	c := Cluster{Slices: objs}
	for _, cl := range claims {
		if err := a.Allocate(context.Background(), cl); err != nil {
			t.Fatalf("%s: %v", cl.Name, err)
		}
		c.Claims = append(c.Claims, *cl)
	}
	r := Report{Pools: append(Compute(c, device.GPUDriver), Compute(c, device.NICDriver)...)}

	gpus := r.Pools[0].GPUs
	if len(gpus) != 8 {
		t.Fatalf("%d GPUs", len(gpus))
	}
	// The allocator fills from the top: memory slices 4-6 are taken, 0-3
	// and 7 are free.
	if got := heldDevices([]*resourceapi.ResourceClaim{mig}); !slices.Equal(got, []string{
		"gpu-0000-1b-00-0-mig-1g-10gb-6", "gpu-0000-1b-00-0-mig-1g-10gb-5", "gpu-0000-1b-00-0-mig-1g-10gb-4"}) {
		t.Fatalf("allocated %v", got)
	}
	// Shares of the default size (4Gi, 10%): 10 on an idle GPU, none
	// beside the MIG partitions, 10-4 beside the two shares of 20%.
	want := map[string]int32{"full": 0, "1g.10gb": 4, "1g.10gb+me": 1, "1g.20gb": 2, "2g.20gb": 2, "3g.40gb": 1, "4g.40gb": 1, "7g.80gb": 0, "share": 0}
	idle := map[string]int32{"full": 1, "1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1, "share": 10}
	shared := map[string]int32{"full": 0, "1g.10gb": 0, "1g.10gb+me": 0, "1g.20gb": 0, "2g.20gb": 0, "3g.40gb": 0, "4g.40gb": 0, "7g.80gb": 0, "share": 6}
	for _, g := range gpus {
		w := idle
		switch g.PCIBusID {
		case gpu:
			w = want
		case shareGPU:
			w = shared
		}
		for _, p := range g.Profiles {
			if p.Allocatable != w[p.Profile] {
				t.Errorf("%s %s: allocatable %d, want %d", g.PCIBusID, p.Profile, p.Allocatable, w[p.Profile])
			}
		}
	}
	if p := r.Pools[0]; *p.AllocatedDevices != 4 || *p.UnavailableDevices != 0 || *p.AvailableDevices != *p.TotalDevices-4 {
		t.Errorf("GPU pool counts %s %s %s of %s", num(p.AllocatedDevices), num(p.AvailableDevices), num(p.UnavailableDevices), num(p.TotalDevices))
	}
	nic := r.Pools[1]
	for _, cs := range nic.ShareableSummary.Capacity {
		if cs.Name == string(device.NICCapBandwidth) && cs.Consumed.String() != "300G" {
			t.Errorf("pool bandwidth consumed %s, want 300G", cs.Consumed)
		}
	}
	var out bytes.Buffer
	if err := WriteTable(&out, r); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		`(?m)^gpu\.hwdra\.io\s+worker-1\s+worker-1\s+1\s+4\s+176\s+4\s+172\s+0$`,
		`(?m)^0000:43:00\.0\s+full\s+1\s+0\s+0\s+0$`,
		`(?m)^\s+share\s+10\s+2\s+0\s+6$`,
		`(?m)^gpu-0000-1b-00-0-share\s+0000:1b:00\.0\s+0\s+held\s+gpu\.hwdra\.io/compute\s+100\s+0\s+100$`,
		`(?m)^gpu-0000-43-00-0-share\s+0000:43:00\.0\s+2\s+no\s+gpu\.hwdra\.io/compute\s+100\s+40\s+60$`,
		`(?m)^\s+gpu\.hwdra\.io/memory\s+80Gi\s+20Gi\s+60Gi$`,
		`(?m)^sriov\.hwdra\.io\s+worker-1\s+worker-1\s+1\s+1\s+9\s+1\s+8\s+0$`,
		`(?m)^0000:1b:00\.0\s+full\s+1\s+0\s+0\s+0$`,
		`(?m)^\s+1g\.10gb\s+7\s+3\s+0\s+4$`,
		`(?m)^nic-0000-18-00-0\s+\S+\s+2\s+no\s+sriov\.hwdra\.io/bandwidth\s+400G\s+300G\s+100G$`,
		`(?m)^\(pool\)\s+sriov\.hwdra\.io/bandwidth\s+3600G\s+300G\s+3300G$`,
	} {
		if !regexp.MustCompile(line).Match(out.Bytes()) {
			t.Errorf("table lacks %s:\n%s", line, out.String())
		}
	}
	t.Logf("\n%s", out.String())
}
