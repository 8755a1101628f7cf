// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
)

// TestTenantNoIOMMUGroupRefused is the attack of issue 34, row 10, on the
// GPU side: a claim for a passthrough GPU, or a vGPU of the
// vendor-specific VFIO framework, on a node whose kernel runs VFIO without
// an IOMMU, which would hand the pod /dev/vfio/noiommu-<N> and with it DMA
// into all of the node's memory. Refused at prepare, naming the claim, the
// device and the setting, nothing left (no vGPU made, no CDI spec); with
// vfio.allowUnsafeNoIOMMU the same claim gets the noiommu node.
func TestTenantNoIOMMUGroupRefused(t *testing.T) {
	for _, tc := range []struct{ name, profile, kind string }{
		{"passthrough GPU", "noIOMMU: true\n" + passthroughNode, device.KindPassthrough},
		{"VFIO framework vGPU", "noIOMMU: true\ngpus: [{model: h100-80gb, count: 1, virtualization: host-vgpu, vgpuFramework: vfio}]", device.KindVGPU},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.profile, false)
			before := e.hwState()
			var name string
			for n, d := range resources.GPUDevices(e.gpus, e.passthrough, device.AllFeatures) {
				if d.Kind == tc.kind && (name == "" || n < name) {
					name = n
				}
			}
			if name == "" {
				t.Fatalf("no %s device published", tc.kind)
			}
			c := allocatedTo(0, name)
			_, err := e.prepare(c)
			if err == nil {
				t.Fatal("prepared")
			}
			t.Logf("refused: %v", err)
			for _, want := range []string{"claim default/" + c.Name, "VFIO group noiommu-", "without an IOMMU", "vfio.allowUnsafeNoIOMMU"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal does not say %q: %v", want, err)
				}
			}
			if got := e.hwState(); got != before {
				t.Errorf("the hardware changed:\n%s\nwas\n%s", got, before)
			}
			if vfs := e.hw.VGPUVFs(); len(vfs) != 0 {
				t.Errorf("VFs left vGPUs: %v", vfs)
			}
			if specs, _ := filepath.Glob(filepath.Join(e.dir, "cdi", "*.json")); len(specs) != 0 {
				t.Errorf("CDI specs left: %v", specs)
			}

			e.noIOMMU = true
			e.restart(nil)
			devs := e.mustPrepare(c)
			spec, err := os.ReadFile(filepath.Join(e.dir, "cdi", cdiSpecName(t, e.dir)))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(spec), `"/dev/vfio/noiommu-`) || len(devs) != 1 {
				t.Errorf("allowed: the spec gives no noiommu group node:\n%s", spec)
			}
			e.unprepare(c)
		})
	}
}

// cdiSpecName is the one CDI spec in the env's directory.
func cdiSpecName(t *testing.T, dir string) string {
	t.Helper()
	specs, _ := filepath.Glob(filepath.Join(dir, "cdi", "*.json"))
	specs = slices.DeleteFunc(specs, func(s string) bool { return !strings.Contains(filepath.Base(s), DriverName) })
	if len(specs) != 1 {
		t.Fatalf("CDI specs %v, want one", specs)
	}
	return filepath.Base(specs[0])
}
