// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestAgentStateLostWhilePodsRun: while a pod with a dynamic MIG partition
// runs, the agent is killed and its state directory is lost, every file
// corrupted or the directory deleted, and it starts again. It keeps
// running: the pod's GPU instance is left as it is (the claim is rebuilt
// from its CDI spec), deleting the pod removes the instance, the MIG mode
// change and the claim's files as if nothing had happened, and a new pod
// gets a partition.
func TestAgentStateLostWhilePodsRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		lose func(t *testing.T, dir string)
	}{
		{"corrupt", func(t *testing.T, dir string) {
			files, _ := filepath.Glob(filepath.Join(dir, "*"))
			if len(files) == 0 {
				t.Fatalf("no state files in %s to corrupt", dir)
			}
			for _, f := range files {
				if err := os.WriteFile(f, []byte("{garbage"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"deleted", func(t *testing.T, dir string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startHWRig(t, "state-"+tc.name, "mock:dgx-h100", nil, device.GPUDriver)
			before := r.state()
			tmpl := r.template("mig-1g.10gb.yaml")
			claim, _ := r.waitRunning("app", "state-"+tc.name+"-create-to-running", r.createPod("app", tmpl))
			running := r.state()
			if running.GPUInstanceCount() != before.GPUInstanceCount()+1 {
				t.Fatalf("no GPU instance for the pod:\n%s", framework.HardwareDiff(before, running))
			}
			r.kill()
			tc.lose(t, r.stateDir)
			since := r.n.KubeletLogSize()
			r.restart(nil)
			r.waitServing(since)
			if diff := framework.HardwareDiff(running, r.state()); diff != "" {
				t.Fatalf("the restarted agent changed the running pod's hardware:\n%s", diff)
			}
			if !r.agent.Running() {
				t.Fatal("the agent did not keep running")
			}
			r.deletePodAndCheck("app", device.GPUDriver, "state-"+tc.name+"-delete-to-unprepared", claim, before)
			// New claims prepare.
			r.waitRunning("again", "state-"+tc.name+"-new-pod-to-running", r.createPod("again", tmpl))
		})
	}
}
