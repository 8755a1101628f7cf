// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/tools/allocate"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// One GPU per mode (MIG off, MIG on, host vGPU) and a CX7.
const scaleProfile = `
gpus:
- {model: h100-80gb, count: 1, pciBusIDs: ["0000:1b:00.0"]}
- {model: h100-80gb, count: 1, pciBusIDs: ["0000:43:00.0"], mig: true}
- {model: h100-80gb, count: 1, pciBusIDs: ["0000:52:00.0"], virtualization: host-vgpu}
nics:
- {model: cx7, count: 1, vfs: 4}
`

func exactly(class, cel string) resourceapi.DeviceRequest {
	return allocate.Request("dev", class, 1, cel)
}

// TestClaimsNeverRewriteThePool: preparing and unpreparing claims of every
// kind — whole GPUs, dynamic MIG instances, MIG-backed and time-sliced
// vGPUs (mediated devices), VF shares — makes no ResourceSlice write: the
// slices describe what the hardware can deliver, and the counters keep the
// scheduler from overlapping an allocated device. Only what the scheduler
// cannot know changes them: a GPU instance made outside the agent is
// published once, without the placements it overlaps.
func TestClaimsNeverRewriteThePool(t *testing.T) {
	node := openNode(t, scaleProfile)
	// Rescans every 10 ms, and each claim stays prepared over two whole
	// rescans (settle counts them).
	a := startAgentOn(t, node, 10*time.Millisecond)
	ctx := context.Background()
	gpus := a.slices(device.GPUDriver, nil)
	nics := a.slices(device.NICDriver, nil)
	published := append(append([]*resourceapi.ResourceSlice(nil), gpus...), nics...)
	before := deviceNames(published)
	gpuDRA := drapb.NewDRAPluginClient(a.dial(a.socket(device.GPUDriver)))
	nicDRA := drapb.NewDRAPluginClient(a.dial(a.socket(device.NICDriver)))

	share := exactly("vf-share.sriov.hwdra.io", "")
	share.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
		device.NICCapBandwidth: resource.MustParse("10G"),
	}}
	kinds := []struct {
		name string
		dra  drapb.DRAPluginClient
		req  resourceapi.DeviceRequest
	}{
		{"full GPU", gpuDRA, exactly("gpu.hwdra.io", "")},
		{"GPU share", gpuDRA, exactly("share.gpu.hwdra.io", "")},
		{"MIG 1g.10gb", gpuDRA, exactly("mig.gpu.hwdra.io", `device.attributes["gpu.hwdra.io"].profile == "1g.10gb"`)},
		{"MIG-backed vGPU", gpuDRA, exactly("vgpu.gpu.hwdra.io", `device.attributes["gpu.hwdra.io"].migBacked`)},
		{"time-sliced vGPU", gpuDRA, exactly("vgpu.gpu.hwdra.io", `!device.attributes["gpu.hwdra.io"].migBacked`)},
		{"VF share", nicDRA, share},
	}
	// Claims of each kind one after another: one more than the NIC has
	// VFs, so a VF that an unprepare did not give back fails a later
	// prepare. The rescans each claim is prepared over prove the rest,
	// not how many claims: twenty of each kind took 5 to 10 minutes under
	// the race detector.
	const claimsPerKind = 5
	writes, handed := a.writes(), a.publications()
	for ki, k := range kinds {
		for i := range claimsPerKind {
			c := a.allocated(published, fmt.Sprintf("claim-%d-%d", ki, i), k.req)
			pb := []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}
			res, err := k.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: pb})
			if err != nil || res.Claims[string(c.UID)].Error != "" {
				t.Fatalf("%s: prepare %s: %v %+v", k.name, c.Name, err, res)
			}
			a.settle()
			un, err := k.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: pb})
			if err != nil || un.Claims[string(c.UID)].Error != "" {
				t.Fatalf("%s: unprepare %s: %v %+v", k.name, c.Name, err, un)
			}
			if err := a.client.ResourceV1().ResourceClaims(c.Namespace).Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		a.settle()
		if n := a.writes() - writes; n != 0 {
			t.Errorf("%s: %d ResourceSlice writes for %d claims", k.name, n, claimsPerKind)
		}
		if n := a.publications() - handed; n != 0 {
			t.Errorf("%s: %v publications for %d claims", k.name, n, claimsPerKind)
		}
		writes, handed = a.writes(), a.publications()
	}

	// An administrator makes a 3g.40gb instance on the MIG GPU.
	const migGPU = "0000:43:00.0"
	at := hw.Placement{Start: 4, Size: 4}
	publications := a.metric(`hwdra_resource_publications_total{driver="gpu.hwdra.io"}`)
	if _, err := node.GPU().CreateGPUInstance(migGPU, migProfile(t, node, migGPU, "3g.40gb").ID, at); err != nil {
		t.Fatal(err)
	}
	static := device.MIGName(migGPU, "3g.40gb", at.Start)
	overlapping := device.MIGName(migGPU, "1g.10gb", at.Start)
	after := devicesByName(a.slices(device.GPUDriver, func(ss []*resourceapi.ResourceSlice) bool {
		return !deviceNames(ss)[overlapping]
	}))
	a.settle()
	if got := atoi(t, a.metric(`hwdra_resource_publications_total{driver="gpu.hwdra.io"}`)) - atoi(t, publications); got != 1 {
		t.Errorf("the out-of-band instance was published %d times, want once", got)
	}
	// On that GPU the whole GPU and its shares (MIG mode can no longer
	// switch) and every placement overlapping the instance go, except the
	// instance itself; everything else stays as it was.
	for name, d := range devicesByName(gpus) {
		gone := false
		if attr(d, "resource.kubernetes.io/pciBusID") == migGPU && name != static {
			switch attr(d, device.AttrType) {
			case device.KindGPU, device.KindShare:
				gone = true
			case device.KindMIG:
				start, size := *d.Attributes["gpu.hwdra.io/placementStart"].IntValue, *d.Attributes["gpu.hwdra.io/placementSize"].IntValue
				gone = hw.Placement{Start: int(start), Size: int(size)}.Overlaps(at)
			}
		}
		if _, kept := after[name]; kept == gone {
			t.Errorf("device %s: published %v after the out-of-band instance, want %v", name, kept, !gone)
		}
	}
	if len(after) >= len(before)-len(deviceNames(nics)) {
		t.Errorf("%d GPU devices after the out-of-band instance, %d before", len(after), len(before)-len(deviceNames(nics)))
	}
}

func devicesByName(ss []*resourceapi.ResourceSlice) map[string]resourceapi.Device {
	out := map[string]resourceapi.Device{}
	for _, s := range ss {
		for _, d := range s.Spec.Devices {
			out[d.Name] = d
		}
	}
	return out
}

func attr(d resourceapi.Device, name resourceapi.QualifiedName) string {
	if v, ok := d.Attributes[name]; ok && v.StringValue != nil {
		return *v.StringValue
	}
	return ""
}

func migProfile(t *testing.T, node *backend.Node, gpu, name string) hw.MIGProfile {
	t.Helper()
	inv, err := node.Inventory(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range inv.GPUs {
		for _, p := range g.MIG.Profiles {
			if g.PCIBusID == gpu && p.Name == name {
				return p
			}
		}
	}
	t.Fatalf("GPU %s has no MIG profile %s", gpu, name)
	return hw.MIGProfile{}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return n
}

// openNode opens mock hardware from a profile for a test to share with the
// agent it starts (startAgentOn), so the test can change the hardware
// behind the agent's back.
func openNode(t testing.TB, profile string) *backend.Node {
	t.Helper()
	n, err := backend.Open("mock:" + writeProfile(t, profile))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}
