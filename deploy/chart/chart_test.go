// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/hwdra/hwdra/deploy"
)

func writeValues(t *testing.T, name, data string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// names maps each class with an extendedResourceName to it.
func names(t *testing.T, files ...string) map[string]string {
	t.Helper()
	classes, err := DeviceClasses(files)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range classes {
		if n := c.Spec.ExtendedResourceName; n != nil {
			out[c.Name] = *n
		}
	}
	return out
}

// TestDefaultsRenderTheShippedClasses: rendered in process with the
// chart's defaults, the DeviceClasses are those of deploy/hwdra.yaml,
// which the helm CLI rendered (hack/render-deploy.sh): the library and
// the CLI take the same steps.
func TestDefaultsRenderTheShippedClasses(t *testing.T) {
	got, err := DeviceClasses(nil)
	if err != nil {
		t.Fatal(err)
	}
	want, err := deploy.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d classes rendered, deploy/hwdra.yaml has %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Name != want[i].Name || !equality.Semantic.DeepEqual(got[i].Spec, want[i].Spec) {
			t.Errorf("class %d: rendered %s %+v, deploy/hwdra.yaml has %s %+v", i, got[i].Name, got[i].Spec, want[i].Name, want[i].Spec)
		}
	}
}

// TestValuesFiles: files merge as helm's -f merges them, later over
// earlier, each over the chart's defaults: the shares get
// nvidia.com/gpu.shared, MIG 1g.10gb its class, a VF share a name of its
// own, and gpu.hwdra.io keeps its default.
func TestValuesFiles(t *testing.T) {
	first := writeValues(t, "a.yaml", "extendedResources:\n  shared: example.com/old\n  migProfiles: [3g.40gb]\n")
	second := writeValues(t, "b.yaml", `extendedResources:
  shared: nvidia.com/gpu.shared
  migProfiles: [1g.10gb]
  classes:
  - {name: example.com/vf, class: vf-share.sriov.hwdra.io}
`)
	got := names(t, first, second)
	want := map[string]string{"gpu.hwdra.io": "nvidia.com/gpu", "share.gpu.hwdra.io": "nvidia.com/gpu.shared",
		"mig-1g.10gb.gpu.hwdra.io": "nvidia.com/mig-1g.10gb", "vf-share.sriov.hwdra.io": "example.com/vf"}
	if len(got) != len(want) {
		t.Errorf("extended resources %v, want %v", got, want)
	}
	for class, name := range want {
		if got[class] != name {
			t.Errorf("class %s maps %q, want %q (all: %v)", class, got[class], name, got)
		}
	}
}

// TestRefusedValues: values the chart refuses give its own error, naming
// the value (and the values file), and no classes.
func TestRefusedValues(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{"extendedResources: {shared: gpu.shared}", `extendedResources.shared: "gpu.shared" is no extended resource name`},
		{"extendedResources: {shared: nvidia.com/gpu}", "extendedResources.shared: nvidia.com/gpu is named twice (also by extendedResources.gpu)"},
		{"extendedResources: {migProfiles: [1g.10gb], classes: [{name: nvidia.com/mig-1g.10gb, class: vf.sriov.hwdra.io}]}",
			"extendedResources.classes[0].name: nvidia.com/mig-1g.10gb is named twice (also by extendedResources.migPrefix + migProfiles)"},
		{"extendedResources: {classes: [{name: example.com/x, class: gpu.example.com}]}", `extendedResources.classes[0].class: "gpu.example.com" is none of the chart's DeviceClasses (gpu.hwdra.io, `},
		{"extendedResources: {shared: nvidia.com/gpu.shared, classes: [{name: example.com/x, class: share.gpu.hwdra.io}]}",
			"extendedResources.classes[0].class: share.gpu.hwdra.io already has extendedResourceName nvidia.com/gpu.shared"},
		{"extendedResources: {classes: [{name: example.com/x}]}", "at '/extendedResources/classes/0': missing property 'class'"},
		{"extendedResources: {share: nvidia.com/gpu.shared}", "at '/extendedResources': additional properties 'share' not allowed"},
		{"extendedResources: [", "cannot unmarshal"},
	} {
		file := writeValues(t, "values.yaml", tc.values)
		classes, err := DeviceClasses([]string{file})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), file) {
			t.Errorf("%s: error %v, want one naming %s and %q", tc.values, err, file, tc.want)
		}
		if classes != nil {
			t.Errorf("%s: refused, yet %d classes returned", tc.values, len(classes))
		}
	}
	if _, err := DeviceClasses([]string{filepath.Join(t.TempDir(), "none.yaml")}); err == nil || !strings.Contains(err.Error(), "none.yaml") {
		t.Errorf("a missing values file: %v", err)
	}
}
