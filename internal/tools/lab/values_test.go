// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var (
	docExamples = filepath.Join("..", "..", "..", "docs", "examples")
	// pluginValues are the chart's values for a cluster coming from the
	// device plugin: extendedResources.shared nvidia.com/gpu.shared and
	// migProfiles [1g.10gb].
	pluginValues = filepath.Join(docExamples, "values", "device-plugin.yaml")
)

// allocSection is the lab output's Allocation section.
func allocSection(out string) string {
	_, alloc, _ := strings.Cut(out, "== Allocation")
	alloc, _, _ = strings.Cut(alloc, "== Prepare")
	return alloc
}

// TestLabValuesSharedGPUPods: the device plugin's renamed time-slicing
// resource (nvidia.com/gpu.shared) through the chart's values alone (no
// DeviceClass in the files): the Deployment's three pods get a share
// each, all of one GPU, and all three are prepared. Without the values
// the same pods are refused, pointing at --values.
func TestLabValuesSharedGPUPods(t *testing.T) {
	pods := filepath.Join(docExamples, "shared-gpu-pods.yaml")
	var out bytes.Buffer
	if err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ValuesFiles: []string{pluginValues}, ClaimFiles: []string{pods}}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := withoutLogs(out.String())
	wantOutput(t, got,
		"--values "+pluginValues+": allocating with the chart's DeviceClasses rendered with these values; extended resources: nvidia.com/gpu (gpu.hwdra.io), nvidia.com/mig-1g.10gb (mig-1g.10gb.gpu.hwdra.io), nvidia.com/gpu.shared (share.gpu.hwdra.io)\n",
		"1 nvidia.com/gpu.shared from DeviceClass share.gpu.hwdra.io")
	if n := strings.Count(allocSection(got), "  device: gpu-0000-1b-00-0-share\n"); n != 3 {
		t.Errorf("%d pods on GPU 0000:1b:00.0's shares, want the three:\n%s", n, allocSection(got))
	}
	if strings.Count(got, "-extended-resources-") == 0 || strings.Count(got, ": unprepared (gpu.hwdra.io)") != 3 {
		t.Errorf("the three pods' claims were not prepared and unprepared:\n%s", got)
	}

	out.Reset()
	err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ClaimFiles: []string{pods}})
	if err == nil || !strings.Contains(err.Error(), "no DeviceClass has extendedResourceName nvidia.com/gpu.shared") || !strings.Contains(err.Error(), "--values") {
		t.Errorf("nvidia.com/gpu.shared without the values: %v", err)
	}
}

// TestLabValuesMIGPods: a pod asking for two nvidia.com/mig-1g.10gb,
// offered by the values' migProfiles, gets two 1g.10gb partitions of the
// class mig-1g.10gb.gpu.hwdra.io, made at prepare and destroyed after.
func TestLabValuesMIGPods(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ValuesFiles: []string{pluginValues}, ClaimFiles: []string{filepath.Join(docExamples, "mig-pods.yaml")}}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := withoutLogs(out.String())
	wantOutput(t, got, "2 nvidia.com/mig-1g.10gb from DeviceClass mig-1g.10gb.gpu.hwdra.io", ": unprepared (gpu.hwdra.io)")
	if n := strings.Count(allocSection(got), "-mig-1g-10gb-"); n != 2 {
		t.Errorf("%d 1g.10gb partitions allocated, want 2:\n%s", n, allocSection(got))
	}
}

// TestLabValuesRefused: values the chart refuses stop the run before
// anything is read, published or prepared, with the chart's error naming
// the value and the file: a bad name, and a name given twice.
func TestLabValuesRefused(t *testing.T) {
	dir := t.TempDir()
	pods := filepath.Join(docExamples, "shared-gpu-pods.yaml")
	for _, tc := range []struct{ values, want string }{
		{"extendedResources: {shared: gpu.shared}", `extendedResources.shared: "gpu.shared" is no extended resource name`},
		{"extendedResources: {shared: nvidia.com/gpu}", "extendedResources.shared: nvidia.com/gpu is named twice (also by extendedResources.gpu)"},
		{"extendedResources:\n  shared: nvidia.com/gpu.shared\n  classes: [{name: nvidia.com/gpu.shared, class: dedicated-share.gpu.hwdra.io}]",
			"extendedResources.classes[0].name: nvidia.com/gpu.shared is named twice (also by extendedResources.shared)"},
	} {
		file := filepath.Join(dir, "values.yaml")
		if err := os.WriteFile(file, []byte(tc.values), 0o644); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ValuesFiles: []string{pluginValues, file}, ClaimFiles: []string{pods}})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), file) {
			t.Errorf("%s: error %v, want the chart's naming %s and %q", tc.values, err, file, tc.want)
		}
		if out.Len() > 0 {
			t.Errorf("%s: refused values, yet the run went on:\n%s", tc.values, out.String())
		}
	}
}
