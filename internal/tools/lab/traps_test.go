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

	"github.com/hwdra/hwdra/deploy"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// TestLabRefusesConfigsNoDriverReads: gpu-mps.yaml with its config's
// driver mistyped (gpu.hwdra.com), or written for NVIDIA's DRA driver
// (gpu.nvidia.com), would get an exclusive GPU without MPS: the lab
// refuses it before prepare, as the agent's prepare would, naming the
// config and the likely fix; nothing is prepared.
func TestLabRefusesConfigsNoDriverReads(t *testing.T) {
	data, err := os.ReadFile(examples("gpu-mps.yaml")[0])
	if err != nil {
		t.Fatal(err)
	}
	for driver, hint := range map[string]string{
		"gpu.hwdra.com":  "(did you mean gpu.hwdra.io?)",
		"gpu.nvidia.com": "(written for NVIDIA's GPU DRA driver: `hwdra convert` rewrites such manifests for hwdra)",
	} {
		file := filepath.Join(t.TempDir(), "mps.yaml")
		if err := os.WriteFile(file, []byte(strings.Replace(string(data), "driver: gpu.hwdra.io", "driver: "+driver, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ClaimFiles: []string{file}})
		want := "claim gpu-mps: spec.devices.config[0] is for driver " + driver + ", which owns none of the devices it applies to (gpu.hwdra.io): no driver reads it " + hint
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %q", err, want)
		}
		if strings.Contains(out.String(), "== Prepare") {
			t.Errorf("%s: the claim was prepared:\n%s", driver, out.String())
		}
	}
}

// TestFirstAvailableFitsEveryMIGModel: first-available.yaml's smallest
// subrequest takes a one-slice MIG partition on every MIG-capable model,
// not only on the H100 whose profile names it once spelled out.
func TestFirstAvailableFitsEveryMIGModel(t *testing.T) {
	classes, err := deploy.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	files, _, _, err := readClaims(examples("first-available.yaml"), nil, classes)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"a30-24gb", "a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "b200-180gb"} {
		t.Run(m, func(t *testing.T) {
			spec := filepath.Join(t.TempDir(), "node.yaml")
			if err := os.WriteFile(spec, []byte("gpus: [{model: "+m+", count: 1, mig: true}]\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			claim := files[0].claims[0].DeepCopy()
			if err := allocate.New(allocate.ClusterFeatures, NodeName, publishedSlices(t, "mock:"+spec), classes).Allocate(context.Background(), claim); err != nil {
				t.Fatal(err)
			}
			if r := claim.Status.Allocation.Devices.Results[0]; r.Request != "gpu/small" || !strings.Contains(r.Device, "-mig-1g-") {
				t.Errorf("got %s for %s, want a 1g partition for gpu/small", r.Device, r.Request)
			}
		})
	}
}

// TestLabNamesTheDevicesPerClaimLimit: two requests of 17 MIG partitions
// each fit the node alone; together they pass the API's 32 devices per
// claim, which is the cause, not devices they compete for.
func TestLabNamesTheDevicesPerClaimLimit(t *testing.T) {
	dir := t.TempDir()
	mig := "exactly: {deviceClassName: mig.gpu.hwdra.io, count: 17}"
	for name, claim := range map[string]string{
		"two-17.yaml": claimYAML("two-17", mig+"\n    - name: more\n      "+mig),
		"one-33.yaml": claimYAML("one-33", "exactly: {deviceClassName: mig.gpu.hwdra.io, count: 33}"),
		"all.yaml":    claimYAML("all", "exactly: {deviceClassName: mig.gpu.hwdra.io, allocationMode: All}"),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(claim), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	err := Run(context.Background(), &bytes.Buffer{}, Options{Hardware: "mock:dgx-h100", ClaimFiles: []string{dir}})
	if err == nil {
		t.Fatal("allocated")
	}
	for _, want := range []string{
		"claim two-17 cannot be allocated on this node:\n        the claim asks for at least 34 devices, more than the API's limit of 32 devices per claim",
		"claim one-33 cannot be allocated on this node:\n        the claim asks for at least 33 devices",
		"claim all cannot be allocated on this node:\n        the claim asks for at least 160 devices",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q", want)
		}
	}
	if strings.Contains(err.Error(), "not all together") {
		t.Errorf("blames competing requests:\n%v", err)
	}
	if t.Failed() {
		t.Log(err)
	}
}

// TestLabAdminAccessLeavesDevicesFree: a claim with admin access to every
// GPU (a monitoring agent's) does not count as their use, as the
// scheduler's allocated state leaves it out: a later claim of all eight
// still gets them.
func TestLabAdminAccessLeavesDevicesFree(t *testing.T) {
	dir := t.TempDir()
	files := []string{filepath.Join(dir, "1-admin.yaml"), filepath.Join(dir, "2-all.yaml")}
	os.WriteFile(files[0], []byte(claimYAML("admin", "exactly: {deviceClassName: gpu.hwdra.io, allocationMode: All, adminAccess: true}")), 0o644)
	os.WriteFile(files[1], []byte(claimYAML("all", "exactly: {deviceClassName: gpu.hwdra.io, count: 8}")), 0o644)
	var out bytes.Buffer
	if err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ClaimFiles: files}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	wantOutput(t, out.String(), "adminAccess: true", "admin: unprepared", "all: unprepared")
	if t.Failed() {
		t.Log(out.String())
	}
}

// TestLabShowsTheSettingsPrepareMade: "Hardware after prepare" shows the
// compute mode and time slice that sharing set and a VF's settings, as
// the hardware has them.
func TestLabShowsTheSettingsPrepareMade(t *testing.T) {
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100",
		ClaimFiles: examples("gpu-timeslicing.yaml", "gpu-mps.yaml", "vf-share-10g.yaml")})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	after := got[strings.Index(got, "== Hardware after prepare =="):]
	wantOutput(t, after,
		"GPU 0000:1b:00.0: compute mode Default (as it was), time slice Long",
		"GPU 0000:43:00.0: compute mode ExclusiveProcess (was Default)",
		"of claim vf-share-10g: max tx rate 10000 Mb/s, min tx rate 10000 Mb/s, VLAN none, trust off, spoof check on",
		"MTU 1500",
	)
	if t.Failed() {
		t.Log(got)
	}
}

// TestVfConfigExample: vf-configured.yaml prepares on Ethernet (cx7) and
// InfiniBand (dgx-a100) PFs alike, its MTU set on the VF, and is refused
// with the reason on a node without NICs.
func TestVfConfigExample(t *testing.T) {
	for _, hw := range []string{"cx7", "dgx-a100"} {
		var out bytes.Buffer
		if err := Run(context.Background(), &out, Options{Hardware: "mock:" + hw, ClaimFiles: examples("vf-configured.yaml")}); err != nil {
			t.Fatalf("%s: %v\n%s", hw, err, out.String())
		}
		wantOutput(t, out.String(), "of claim vf-configured: ", "MTU 4000", "vf-configured: unprepared")
	}
	err := Run(context.Background(), &bytes.Buffer{}, Options{Hardware: "mock:h100-mig", ClaimFiles: examples("vf-configured.yaml")})
	if err == nil || !strings.Contains(err.Error(), "request nic: class vf-share.sriov.hwdra.io has no device on this node") {
		t.Errorf("on a node without NICs: %v", err)
	}
}
