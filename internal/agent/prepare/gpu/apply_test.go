// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
)

// TestMetadataIsWhatTheSlicePublishes: a container's metadata about its
// device holds every attribute the ResourceSlice publishes for it, same
// names, same values, plus what exists only once prepared.
func TestMetadataIsWhatTheSlicePublishes(t *testing.T) {
	for _, tc := range []struct {
		name, profile string
		req           request
		runtime       []string
	}{
		{"full GPU", "gpus: [{model: h100-80gb, count: 1}]", request{name: "gpu", cel: `profile == "full"`}, nil},
		{"MIG", "gpus: [{model: h100-80gb, count: 1, mig: true}]", request{name: "mig", cel: `profile == "1g.10gb"`},
			[]string{"gpu.hwdra.io/uuid", "gpu.hwdra.io/gpuInstanceID", "gpu.hwdra.io/computeInstanceID"}},
		{"vGPU", "h100-vgpu", request{name: "vgpu", cel: `type == "vgpu" && device.attributes["gpu.hwdra.io"].migBacked`},
			[]string{"gpu.hwdra.io/mdevUUID", "mdevUUID", "gpu.hwdra.io/mdevParent", "gpu.hwdra.io/gpuInstanceID"}},
		{"vGPU of the VFIO framework", vfioHost, request{name: "vgpu", cel: `type == "vgpu" && device.attributes["gpu.hwdra.io"].migBacked`},
			[]string{"gpu.hwdra.io/parentPciBusID", "gpu.hwdra.io/gpuInstanceID"}},
		{"passthrough", passthroughNode, request{name: "gpu", cel: `type == "passthrough"`}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.profile, true)
			c := e.claim(tc.req)
			dev := e.mustPrepare(c)[0]
			published := resources.GPUDevices(e.gpus, e.passthrough, device.AllFeatures)[dev.DeviceName].Attributes
			if len(published) == 0 {
				t.Fatalf("device %s is not published", dev.DeviceName)
			}
			got := dev.Metadata.Attributes
			for name, want := range published {
				if name == "resource.kubernetes.io/pciBusID" && got["gpu.hwdra.io/parentPciBusID"].StringValue != nil {
					// A VF's vGPU: the VF's address, the GPU's as the parent's.
					name = "gpu.hwdra.io/parentPciBusID"
				}
				if v, ok := got[string(name)]; !ok || !equality.Semantic.DeepEqual(v, want) {
					t.Errorf("metadata %s = %v, the slice publishes %v", name, v, want)
				}
			}
			for _, name := range tc.runtime {
				if _, ok := got[name]; !ok {
					t.Errorf("no %s in the metadata", name)
				}
			}
			if len(got) != len(published)+len(tc.runtime) {
				t.Errorf("metadata has %d attributes, want the %d published and %v", len(got), len(published), tc.runtime)
			}
			e.unprepare(c)
		})
	}
}
