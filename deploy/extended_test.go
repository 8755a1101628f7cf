// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package deploy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// classFor finds the DeviceClass an extended resource maps to, as the
// scheduler's cache does (k8s.io/dynamic-resource-allocation
// deviceclass/extendedresourcecache: spec.extendedResourceName).
func classFor(t *testing.T, classes []*resourceapi.DeviceClass, name string) *resourceapi.DeviceClass {
	t.Helper()
	var found *resourceapi.DeviceClass
	for _, c := range classes {
		if c.Spec.ExtendedResourceName != nil && *c.Spec.ExtendedResourceName == name {
			if found != nil {
				t.Fatalf("%s maps to %s and %s", name, found.Name, c.Name)
			}
			found = c
		}
	}
	if found == nil {
		t.Fatalf("no DeviceClass maps %s", name)
	}
	return found
}

var seq int

// extendedClaim is the claim kube-scheduler makes for a pod whose one
// container asks for count of an extended resource
// (pkg/scheduler/framework/plugins/dynamicresources
// createRequestsAndMappings: request "container-<index>-request-<index of
// the resource among the container's sorted requests>", the mapped class,
// exactly count devices).
func extendedClaim(class string, count int64) *resourceapi.ResourceClaim {
	seq++
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d-extended-resources-x", seq), Namespace: "default", UID: types.UID(fmt.Sprint("ext-", seq)),
			Annotations: map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    "container-0-request-0",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count},
		}}}},
	}
}

// exampleClaim reads examples/<file>.
func exampleClaim(t *testing.T, file string) *resourceapi.ResourceClaim {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("examples", file))
	if err != nil {
		t.Fatal(err)
	}
	var c resourceapi.ResourceClaim
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		t.Fatal(err)
	}
	seq++
	c.Namespace, c.UID = "default", types.UID(fmt.Sprint("claim-", seq))
	for i := range c.Spec.Devices.Requests { // the API server's defaults
		if r := c.Spec.Devices.Requests[i].Exactly; r != nil && r.AllocationMode == "" {
			r.AllocationMode, r.Count = resourceapi.DeviceAllocationModeExactCount, max(r.Count, 1)
		}
	}
	return &c
}

// nodeAllocator is the scheduler's allocator over a mock node's slices
// and the shipped classes, and the number of whole GPUs they publish.
func nodeAllocator(t *testing.T, profile string, classes []*resourceapi.DeviceClass) (*allocate.Allocator, int) {
	t.Helper()
	inv, err := backend.Probe(context.Background(), "mock:"+profile)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := resources.ForNode("node-1", inv, config.Default(), device.AllFeatures, hw.Health{})
	var objs []*resourceapi.ResourceSlice
	whole := 0
	for driver, r := range res {
		for _, s := range resources.Objects(driver, "node-1", r) {
			objs = append(objs, &s)
			for _, d := range s.Spec.Devices {
				if p := d.Attributes[device.AttrProfile]; driver == device.GPUDriver && p.StringValue != nil && *p.StringValue == device.ProfileFull {
					whole++
				}
			}
		}
	}
	return allocate.New(allocate.ClusterFeatures, "node-1", objs, classes), whole
}

// TestGPUExtendedResource: nvidia.com/gpu maps to the whole-GPU class.
// Pods asking by extended resource and claims asking by class share a
// node's GPUs without over-admitting: every GPU once, then neither kind
// fits. A pod asking for one GPU more than the node has is unschedulable
// at once (the allocator says it does not fit; not the scheduler's 10 s
// filter timeout, which would be an error retried with backoff).
func TestGPUExtendedResource(t *testing.T) {
	classes, err := DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	class := classFor(t, classes, "nvidia.com/gpu").Name
	if class != "gpu.hwdra.io" {
		t.Fatalf("nvidia.com/gpu maps to %s, want gpu.hwdra.io", class)
	}
	// Every mock node with whole GPUs (MIG-mode and vGPU hosts publish
	// none: their GPUs are partitioned).
	for _, profile := range []string{"dgx-a100", "dgx-h100", "dgx-h200"} {
		t.Run(profile, func(t *testing.T) {
			a, gpus := nodeAllocator(t, profile, classes)
			if gpus != 8 {
				t.Fatalf("%d whole GPUs on %s", gpus, profile)
			}
			ctx := context.Background()
			used := map[string]string{}
			take := func(c *resourceapi.ResourceClaim) {
				t.Helper()
				if err := a.Allocate(ctx, c); err != nil {
					t.Fatalf("%s: %v (%d GPUs taken)", c.Name, err, len(used))
				}
				for _, r := range c.Status.Allocation.Devices.Results {
					if other, ok := used[r.Device]; ok {
						t.Fatalf("%s and %s both got %s", other, c.Name, r.Device)
					}
					used[r.Device] = c.Name
				}
			}
			for len(used) < gpus {
				switch {
				case len(used)%3 == 0 && gpus-len(used) >= 2:
					take(extendedClaim(class, 2))
				case len(used)%3 == 1:
					take(extendedClaim(class, 1))
				default:
					take(exampleClaim(t, "gpu-full.yaml"))
				}
			}
			for _, c := range []*resourceapi.ResourceClaim{extendedClaim(class, 1), exampleClaim(t, "gpu-full.yaml")} {
				if err := a.Allocate(ctx, c); !errors.Is(err, allocate.ErrUnsatisfiable) {
					t.Errorf("%s on a node with every GPU taken: %v, want it not to fit", c.Name, err)
				}
			}

			fresh, _ := nodeAllocator(t, profile, classes)
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := fresh.Allocate(ctx, extendedClaim(class, int64(gpus+1))); !errors.Is(err, allocate.ErrUnsatisfiable) {
				t.Errorf("nvidia.com/gpu: %d on a node of %d: %v, want it not to fit", gpus+1, gpus, err)
			}
		})
	}
}
