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

// A cluster's own DeviceClass (what hwdra convert keeps): MIG 1g.10gb
// partitions, also offered as the device plugin's mixed-strategy name.
const teamClass = `apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: team-small.example.com}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.hwdra.io" && device.attributes["gpu.hwdra.io"].profile == "1g.10gb"'}
  extendedResourceName: nvidia.com/mig-1g.10gb
`

// TestLabAllocatesWithTheFilesClasses: a claim of a DeviceClass given in
// the files, and a pod asking for its extendedResourceName, are allocated
// with it (a 1g.10gb partition each), the class said in the output; a
// class of the chart's name replaces the chart's; two of one name are
// refused.
func TestLabAllocatesWithTheFilesClasses(t *testing.T) {
	dir := t.TempDir()
	write := func(name, doc string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	classes := write("classes.yaml", teamClass+`---
apiVersion: resource.k8s.io/v1beta2
kind: DeviceClass
metadata: {name: gpu.hwdra.io}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.hwdra.io" && device.attributes["gpu.hwdra.io"].type == "gpu" && device.attributes["resource.kubernetes.io"].pciBusID == "0000:61:00.0"'}
`)
	claim := write("claim.yaml", claimYAML("small", "exactly: {deviceClassName: team-small.example.com}")+"---\n"+claimYAML("whole", "exactly: {deviceClassName: gpu.hwdra.io}"))
	pod := write("pod.yaml", `apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  containers:
  - name: c
    image: x
    resources: {limits: {nvidia.com/mig-1g.10gb: 1}}
`)
	var out bytes.Buffer
	if err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ClaimFiles: []string{classes, claim, pod}}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := withoutLogs(out.String())
	wantOutput(t, got,
		classes+", document 1: DeviceClass team-small.example.com: allocated with, beside the chart's\n",
		classes+", document 2: DeviceClass gpu.hwdra.io: allocated with, over the chart's of that name\n",
		"1 nvidia.com/mig-1g.10gb from DeviceClass team-small.example.com",
		"small: unprepared (gpu.hwdra.io)\n",
		"whole: unprepared (gpu.hwdra.io)\n",
	)
	_, alloc, _ := strings.Cut(got, "== Allocation")
	alloc, _, _ = strings.Cut(alloc, "== Prepare")
	if n := strings.Count(alloc, "-mig-1g-10gb-"); n != 2 {
		t.Errorf("%d 1g.10gb partitions allocated, want the claim's and the pod's:\n%s", n, alloc)
	}
	if !strings.Contains(alloc, "whole:\n- device: gpu-0000-61-00-0\n") {
		t.Errorf("the whole GPU is not the one the file's gpu.hwdra.io selects:\n%s", alloc)
	}

	dup := write("dup.yaml", teamClass)
	err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ClaimFiles: []string{classes, dup, claim}})
	if err == nil || !strings.Contains(err.Error(), dup+", document 1: DeviceClass team-small.example.com already read from "+classes+", document 1") {
		t.Errorf("two classes of one name: %v", err)
	}
}
