// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// Bad configuration fails the claim's prepare with an error naming the
// claim, the request and the field, before any hardware is touched.
func TestBadConfig(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", false)
	before := e.hwState()
	const gv = `"apiVersion": "gpu.hwdra.io/v1alpha1", "kind": "GpuConfig"`
	for _, tc := range []struct {
		name, cel, config string
		want              []string
	}{
		{"compute slices not offered by the profile", `profile == "4g.40gb"`, `{` + gv + `, "mig": {"computeInstanceSlices": 3}}`,
			[]string{`mig.computeInstanceSlices: Invalid value: 3`, "MIG profile 4g.40gb offers compute instances of [1 2 4] slices"}},
		{"compute slices larger than the profile", `profile == "2g.20gb"`, `{` + gv + `, "mig": {"computeInstanceSlices": 4}}`,
			[]string{`mig.computeInstanceSlices: Invalid value: 4`}},
		{"compute slices out of range", `profile == "1g.10gb"`, `{` + gv + `, "mig": {"computeInstanceSlices": 9}}`,
			[]string{`mig.computeInstanceSlices: Invalid value: 9: must be between 1 and 8`}},
		{"unknown field", `profile == "1g.10gb"`, `{` + gv + `, "mig": {"computeSlices": 1}}`,
			[]string{`unknown field "mig.computeSlices"`}},
		{"another driver's type", `profile == "full"`, `{"apiVersion": "sriov.hwdra.io/v1alpha1", "kind": "VfConfig"}`,
			[]string{"VfConfig"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.claim(request{name: "part", cel: tc.cel, config: tc.config})
			defer e.alloc.Release(c)
			_, err := e.prepare(c)
			if err == nil {
				t.Fatal("prepare succeeded")
			}
			for _, want := range append(tc.want, "default/"+c.Name, `request "part"`) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if got := e.hwState(); got != before {
				t.Errorf("hardware touched:\n%s\nwas\n%s", got, before)
			}
			if _, ok := e.checkpointRecord(c.UID); ok {
				t.Error("failed claim left in the checkpoint")
			}
		})
	}
}

// A device the node does not publish (any more) is an error naming it.
func TestUnknownDevice(t *testing.T) {
	e := newEnv(t, "h100-mig", false)
	c := e.claim(request{name: "gpu", cel: `profile == "1g.10gb"`})
	const gone = "gpu-0000-1b-00-0-mig-7g-80gb-0" // overlaps the static partition: never published
	c.Status.Allocation.Devices.Results[0].Device = gone
	if _, err := e.prepare(c); err == nil || !strings.Contains(err.Error(), `device "`+gone+`"`) || !strings.Contains(err.Error(), `request "gpu"`) {
		t.Errorf("prepare: %v", err)
	}
	c.Status.Allocation = nil
	if _, err := e.prepare(c); err == nil || !strings.Contains(err.Error(), "not allocated") {
		t.Errorf("unallocated claim: %v", err)
	}
}

// Without the toolkit's spec (and here without NVML to generate from)
// prepare works and containers get device nodes only; once the spec
// appears its libraries are injected, and its arrival said once.
func TestDriverSpec(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 2}]", false)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(context.Background(), logger)
	prepare := func() *resourceapi.ResourceClaim {
		t.Helper()
		c := e.claim(request{name: "gpu", cel: `profile == "full"`})
		res, err := e.plugin.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
		if err != nil || res[c.UID].Err != nil {
			t.Fatal(err, res[c.UID].Err)
		}
		spec := e.inject(res[c.UID].Devices)
		if spec.Hooks != nil && (len(spec.Mounts) > 0) != (len(spec.Hooks.CreateContainer) > 0) {
			t.Errorf("mounts %v, hooks %v", spec.Mounts, spec.Hooks)
		}
		return c
	}
	mounts := func(c *resourceapi.ResourceClaim) int {
		devs, _ := e.prepare(c) // prepared already: the recorded answer
		return len(e.inject(devs).Mounts)
	}
	a := prepare()
	if mounts(a) != 0 {
		t.Error("driver libraries without a driver spec")
	}
	writeDriverSpec(t, filepath.Join(e.dir, "etc-cdi"))
	if mounts(prepare()) != 1 {
		t.Error("driver spec written later not picked up")
	}
	buf := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if n := strings.Count(buf, "from the NVIDIA Container Toolkit's spec"); n != 1 {
		t.Errorf("the spec's arrival logged %d times:\n%s", n, buf)
	}
	// A broken spec next to it is logged and ignored.
	os.WriteFile(filepath.Join(e.dir, "etc-cdi", "broken.yaml"), []byte("kind: [nope"), 0o644)
	e.unprepare(a)
	e.alloc.Release(a)
	a = prepare()
	if mounts(a) != 1 {
		t.Error("a broken spec hid the driver spec")
	}
}

// Claims prepared concurrently on one GPU each get their own partition.
func TestConcurrentClaims(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 2}]", false)
	before := e.hwState()
	var claims []*resourceapi.ResourceClaim
	for i := 0; i < 7; i++ {
		claims = append(claims, e.claim(request{name: "mig", cel: `profile == "1g.10gb"`}))
	}
	claims = append(claims, e.claim(request{name: "gpu", cel: `profile == "full"`}))
	uuids := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range claims {
		wg.Go(func() {
			res, _ := e.plugin.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
			if err := res[c.UID].Err; err != nil {
				t.Errorf("%s: %v", c.Name, err)
				return
			}
			mu.Lock()
			uuids[attr(res[c.UID].Devices[0], "uuid")] = true
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(uuids) != len(claims) {
		t.Errorf("%d distinct UUIDs for %d claims", len(uuids), len(claims))
	}
	n := 0
	for _, g := range e.gpus {
		list, _ := e.nvml.GPUInstances(g.PCIBusID)
		n += len(list)
	}
	if n != 7 {
		t.Errorf("%d GPU instances, want 7:\n%s", n, e.hwState())
	}
	for _, c := range claims {
		wg.Go(func() {
			res, _ := e.plugin.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: c.UID}})
			if err := res[c.UID]; err != nil {
				t.Errorf("unprepare %s: %v", c.Name, err)
			}
		})
	}
	wg.Wait()
	if got := e.hwState(); got != before {
		t.Errorf("after unprepare:\n%s\nwant\n%s", got, before)
	}
}

// A claim with several devices (a whole GPU and two MIG partitions of
// another GPU) and a result of another driver: each GPU device gets its
// own CDI device, the other driver's result is left to it.
func TestMultiDeviceClaim(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 2}]", true)
	before := e.hwState()
	c := e.claim(request{name: "mig-a", cel: `profile == "1g.10gb"`}, request{name: "mig-b", cel: `profile == "2g.20gb"`},
		request{name: "whole", cel: `profile == "full"`})
	c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
		Request: "nic", Driver: "sriov.hwdra.io", Pool: testNode, Device: "pf-0000-18-00-0",
	})
	devs := e.mustPrepare(c)
	if len(devs) != 3 {
		t.Fatalf("devices %+v", devs)
	}
	ids := map[string]bool{}
	for _, d := range devs {
		for _, id := range d.CDIDeviceIDs {
			ids[id] = true
		}
	}
	spec := e.inject(devs)
	if len(ids) != 3 || len(spec.Mounts) != 1 {
		t.Errorf("CDI devices %v, mounts %v", ids, spec.Mounts)
	}
	for _, d := range devs {
		if v := attr(d, "uuid"); v == "<unset>" || !slices.Contains(spec.Process.Env, envName(d.DeviceName, "UUID")+"="+v) {
			t.Errorf("%s: uuid %s not in the environment %v", d.DeviceName, v, spec.Process.Env)
		}
	}
	e.unprepare(c)
	if got := e.hwState(); got != before {
		t.Errorf("after unprepare:\n%s\nwant\n%s", got, before)
	}
}

// MIG mode is switched only where nothing runs on the GPU: otherwise the
// prepare fails saying so, and the GPU is left as it was.
func TestMIGModeNotSwitchedUnderRunningProcesses(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", false)
	before := e.hwState()
	if err := e.hw.SetRunningProcesses(e.gpus[0].PCIBusID, 4242); err != nil {
		t.Fatal(err)
	}
	c := e.claim(request{name: "mig", cel: `profile == "1g.10gb"`})
	if _, err := e.prepare(c); err == nil || !strings.Contains(err.Error(), "1 processes run on the GPU") {
		t.Fatalf("prepare: %v", err)
	}
	e.wantAsBefore(t, before, "after the refused prepare")
	e.hw.SetRunningProcesses(e.gpus[0].PCIBusID)
	e.mustPrepare(c)
	e.unprepare(c)
}
