// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestCrashDuringMIGPrepare: the agent is killed (SIGKILL) in the middle
// of a dynamic-MIG prepare, while the hardware creates the pod's GPU
// instance (the mock takes 3 s for it; the instance exists, the agent
// never learns its ID), and restarted with the same flags, state directory
// and hardware. The kubelet retries NodePrepareResources, the pod runs,
// and exactly one GPU instance exists: the one its container was given.
// Deleting the pod destroys it, restores the GPU's MIG mode and removes
// the claim's CDI spec and metadata.
func TestCrashDuringMIGPrepare(t *testing.T) {
	r := startHWRig(t, "crash-mig", "mock:dgx-h100", []string{persist.TimingsEnv + "=createGpuInstance=3s"}, device.GPUDriver)
	before := r.state()
	if n := before.GPUInstanceCount(); n != 0 {
		t.Fatalf("dgx-h100 starts with %d GPU instances, want none", n)
	}
	tmpl := r.template("mig-1g.10gb.yaml")
	began := r.createPod("mig", tmpl)

	op, err := framework.WaitMockBusy(r.ctx, r.mockDir, "createGpuInstance", 60*time.Second)
	if err != nil {
		t.Fatalf("the agent never started creating the GPU instance: %v\nevents: %v", err, r.podEvents("mig"))
	}
	if op.PID != r.agent.Pid() {
		t.Fatalf("GPU instance creation in progress by pid %d, the agent is %d", op.PID, r.agent.Pid())
	}
	r.kill()
	mid := r.state()
	t.Logf("killed while creating a GPU instance on %s: %d GPU instance(s) left on the hardware", op.Device, mid.GPUInstanceCount())
	if mid.GPUInstanceCount() != 1 {
		t.Errorf("the interrupted call's GPU instance is not on the hardware (%d instances): the scenario tests less than it says", mid.GPUInstanceCount())
	}

	r.restart(nil)
	claim, out := r.waitRunning("mig", "crash-mig-sigkill-during-createGpuInstance", began)
	env := out.Env
	after := r.state()
	if !interrupted(after, "createGpuInstance") {
		t.Errorf("the mock records no interrupted createGpuInstance: %+v", after.Interrupted)
	}
	if n := after.GPUInstanceCount(); n != 1 {
		t.Fatalf("%d GPU instances after the restarted agent prepared the claim, want exactly 1:\n%s", n, framework.StateJSON(after))
	}
	var gpu persist.GPUState
	for _, g := range after.GPUs {
		if len(g.GPUInstances) > 0 {
			gpu = g
		}
	}
	gi := gpu.GPUInstances[0]
	if gi.Profile != "1g.10gb" || len(gi.ComputeInstances) != 1 || !gpu.MIG.Current {
		t.Fatalf("GPU %s: MIG %v, instance %+v; want MIG on and one 1g.10gb instance with one compute instance", gpu.BusID, gpu.MIG.Current, gi)
	}
	migUUID := gi.ComputeInstances[0].UUID
	var got []string
	for k, v := range env {
		if strings.HasPrefix(k, "HWDRA_") && strings.HasSuffix(k, "_UUID") {
			got = append(got, k+"="+v)
			if v == migUUID {
				got = nil
				break
			}
		}
	}
	if got != nil {
		t.Errorf("the container was not given the only GPU instance's MIG device %s: %v", migUUID, got)
	}
	// The instance is the allocated one, at the allocated placement.
	if res := claim.Status.Allocation.Devices.Results; len(res) != 1 || res[0].Device != device.MIGName(gpu.BusID, gi.Profile, gi.Start) {
		t.Errorf("allocated %+v, the GPU instance is %s at %d on %s", res, gi.Profile, gi.Start, gpu.BusID)
	}

	r.deletePodAndCheck("mig", device.GPUDriver, "crash-mig-delete-to-unprepared", claim, before)
}

// interrupted: the mock saw a call of this name interrupted by a crash.
func interrupted(s persist.State, call string) bool {
	for _, op := range s.Interrupted {
		if op.Call == call {
			return true
		}
	}
	return false
}
