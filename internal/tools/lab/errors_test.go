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

// TestLabReportsEveryErrorAtOnce: a pod with three problems says three; a
// document of a kind that does not exist (Pood) does not hide the
// others; each of a config's problems is said, an NVIDIA config is
// pointed at hwdra convert; and all of them come from one run, nothing
// allocated.
func TestLabReportsEveryErrorAtOnce(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.yaml")
	b := filepath.Join(dir, "b.yaml")
	if err := os.WriteFile(a, []byte(`apiVersion: v1
kind: Pood
metadata: {name: typo}
---
apiVersion: v1
kind: Pod
metadata: {name: three}
spec:
  resourceClaims:
  - {name: gpu, resourceClaimName: missing}
  containers:
  - name: c
    image: x
    resources:
      claims: [{name: other}]
      limits: {example.com/nope: 1}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, []byte(claimYAML("two-problems", "exactly: {deviceClassName: gpu.hwdra.io}")+`    config:
    - opaque:
        driver: gpu.hwdra.io
        parameters: {apiVersion: gpu.hwdra.io/v1alpha1, kind: GpuConfig, colour: red, sharing: {strategy: Sometimes}}
---
`+claimYAML("nvidia", "exactly: {deviceClassName: gpu.hwdra.io}")+`    config:
    - opaque:
        driver: gpu.hwdra.io
        parameters: {apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig, sharing: {strategy: MPS}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ClaimFiles: []string{a, b}})
	if err == nil {
		t.Fatalf("no error:\n%s", out.String())
	}
	for _, want := range []string{
		a + ", document 1: Pood typo: no kind Pood in v1",
		a + ", document 2: Pod default/three: spec.resourceClaims[0].resourceClaimName: ResourceClaim default/missing is in none of the files given",
		a + `, document 2: Pod default/three: spec.containers[0].resources.claims[0].name: "other": must be the name of one entry in spec.resourceClaims`,
		a + ", document 2: Pod default/three: spec.containers[0].resources.limits[example.com/nope]: no DeviceClass has extendedResourceName example.com/nope",
		b + `, document 1: ResourceClaim two-problems: ResourceClaim "two-problems": configs its prepare refuses:`,
		`spec.devices.config[0].opaque.parameters: unknown field "colour"`,
		`spec.devices.config[0].opaque.parameters: sharing.strategy: Unsupported value: "Sometimes"`,
		"spec.devices.config[0].opaque.parameters: apiVersion: Invalid value: \"resource.nvidia.com/v1beta1\": GpuConfig is written for NVIDIA's GPU DRA driver: `hwdra convert` rewrites",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "== Allocation") {
		t.Error("something was allocated")
	}
	if t.Failed() {
		t.Log(err)
	}
}
