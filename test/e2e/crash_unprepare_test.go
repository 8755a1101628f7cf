// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"strconv"
	"testing"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestDeletingPodsRestoresHardware: deleting a pod unprepares its claim
// without a trace. For a dynamic MIG partition, a vGPU and a VF bandwidth
// share, the hardware's persisted state while the pod runs shows what
// prepare made (a GPU instance, a mediated device, a rate-limited VF), and
// after the pod is deleted it equals the state before the pod: no GPU
// instance, no mediated device, MIG modes and VF settings as they were;
// the agent's checkpoint and ledger are empty and no CDI spec or metadata
// file of the claim remains.
func TestDeletingPodsRestoresHardware(t *testing.T) {
	for _, tc := range []struct {
		name, hardware, driver, example string
		// made checks that the running pod's prepare changed the
		// hardware the way it should; it returns what it saw.
		made func(before, running persist.State) (string, bool)
	}{
		{"mig", "mock:dgx-h100", device.GPUDriver, "mig-1g.10gb.yaml", func(before, running persist.State) (string, bool) {
			n := running.GPUInstanceCount()
			return "GPU instances: " + strconv.Itoa(n), n == before.GPUInstanceCount()+1
		}},
		{"vgpu", "mock:h100-vgpu", device.GPUDriver, "vgpu.yaml", func(before, running persist.State) (string, bool) {
			n := len(running.Mdevs)
			return "mediated devices: " + strconv.Itoa(n), n == len(before.Mdevs)+1
		}},
		{"vf-share", "mock:cx7", device.NICDriver, "vf-share-10g.yaml", func(before, running persist.State) (string, bool) {
			changed := changedVFs(before, running)
			return "VFs configured: " + strconv.Itoa(len(changed)), len(changed) == 1 && running.VFs[changed[0]].MaxTxRateMbps == 10000
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startHWRig(t, "unprepare-"+tc.name, tc.hardware, nil, tc.driver)
			before := r.state()
			tmpl := r.template(tc.example)
			began := r.createPod("app", tmpl)
			claim, _ := r.waitRunning("app", "unprepare-"+tc.name+"-create-to-running", began)
			running := r.state()
			if saw, ok := tc.made(before, running); !ok {
				t.Fatalf("prepare did not make what the claim needs (%s):\n%s", saw, framework.HardwareDiff(before, running))
			} else {
				t.Logf("while the pod runs: %s", saw)
			}
			if files := r.n.ClaimFiles(tc.driver, claim.Namespace, claim.Name, string(claim.UID)); len(files) == 0 && tc.driver == device.GPUDriver {
				t.Errorf("no CDI spec or metadata of claim %s while its pod runs: the check after deletion proves nothing", claim.Name)
			}
			r.deletePodAndCheck("app", tc.driver, "unprepare-"+tc.name+"-delete-to-unprepared", claim, before)
		})
	}
}
