// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestAgentGPUPods: the agent, run as the DaemonSet would on mock DGX H100
// hardware with its own least-privilege credentials, publishes its slices;
// pods asking for a full GPU, a MIG partition and a prioritized list through
// ResourceClaimTemplates are scheduled, prepared by the real kubelet through
// the agent's plugin, and run. Each container's own output shows the device
// nodes and environment from our CDI spec and the KEP-5304 metadata naming
// its device under the top-level request name. Deleting a pod unprepares:
// the claim's CDI spec goes away.
func TestAgentGPUPods(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	began := time.Now()
	n.StartAgent(t, "mock:dgx-h100")
	if _, err := n.WaitResourceSlices(ctx, "gpu.hwdra.io", 60*time.Second); err != nil {
		t.Fatal(err)
	}
	framework.RecordTiming(t, "agent start -> gpu slices published", time.Since(began))
	ns := n.CreateNamespace(t, "agent-gpu")

	for _, tc := range []struct {
		example string
		request string // top-level request: the metadata's directory and name
	}{
		{"gpu-full.yaml", "gpu"},
		{"mig-1g.10gb.yaml", "mig"},
		{"first-available.yaml", "gpu"}, // allocated as gpu/small
	} {
		t.Run(tc.example, func(t *testing.T) {
			claim, err := framework.ExampleClaim(tc.example)
			if err != nil {
				t.Fatal(err)
			}
			tmpl := framework.TemplateFor(claim)
			if _, err := n.Admin.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			metadata := framework.MetadataPath("devices", tc.request, "gpu.hwdra.io")
			pod := framework.PodWithClaimTemplate(claim.Name, tmpl.Name, "/dev", metadata)
			began := time.Now()
			if _, err := n.Admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := n.WaitPodRunning(ctx, ns, pod.Name, 90*time.Second); err != nil {
				t.Fatal(err)
			}
			framework.RecordTiming(t, "pod creation -> Running through the agent ("+tc.example+")", time.Since(began))
			got, _, err := n.WaitPodClaimAllocated(ctx, ns, pod.Name, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			device := got.Status.Allocation.Devices.Results[0].Device
			// "gpu/small" for a prioritized list: the library files the
			// metadata under the top-level request and records the
			// subrequest inside.
			allocatedRequest := got.Status.Allocation.Devices.Results[0].Request
			logs, err := n.WaitPodLogs(ctx, ns, pod.Name, "app", "=== END", 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			out := framework.ParseAppOutput(logs)
			if !anyNvidiaGPU(out.Devices) {
				t.Errorf("no GPU device node from the CDI spec in /dev: %v", out.Devices)
			}
			if _, ok := out.Devices["/dev/nvidiactl"]; !ok {
				t.Errorf("no /dev/nvidiactl from the CDI spec: %v", out.Devices)
			}
			var hwdraEnv bool
			for k := range out.Env {
				hwdraEnv = hwdraEnv || strings.HasPrefix(k, "HWDRA_")
			}
			if !hwdraEnv {
				t.Errorf("no HWDRA_* variable from the CDI spec: %v", out.Env)
			}
			docs, err := framework.DecodeMetadata(out.Files[metadata])
			if err != nil || len(docs) == 0 {
				t.Fatalf("metadata %s: %v (%d documents)\n%s", metadata, err, len(docs), logs)
			}
			for _, d := range docs {
				if len(d.Requests) != 1 || d.Requests[0].Name != allocatedRequest || len(d.Requests[0].Devices) != 1 ||
					d.Requests[0].Devices[0].Name != device {
					t.Errorf("metadata %s does not name request %s with device %s: %+v", d.APIVersion, allocatedRequest, device, d)
				}
			}

			// Deleting the pod unprepares the claim: its CDI spec goes away.
			claimUID := string(got.UID)
			if specs := cdiSpecsMentioning(t, n.CDIDir, claimUID); len(specs) == 0 {
				t.Errorf("no CDI spec in %s mentions claim %s while the pod runs", n.CDIDir, claimUID)
			}
			if err := n.Admin.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := n.WaitPodGone(ctx, ns, pod.Name, 60*time.Second); err != nil {
				t.Fatal(err)
			}
			waitfor.True(t, "claim "+claimUID+"'s CDI spec gone from "+n.CDIDir, 30*time.Second, func() bool {
				return len(cdiSpecsMentioning(t, n.CDIDir, claimUID)) == 0
			})
		})
	}
}

func anyNvidiaGPU(devs map[string]string) bool {
	for p := range devs {
		rest, ok := strings.CutPrefix(p, "/dev/nvidia")
		if ok && rest != "" && rest[0] >= '0' && rest[0] <= '9' {
			return true
		}
	}
	return false
}

// cdiSpecsMentioning lists the CDI spec files that contain s.
func cdiSpecsMentioning(t *testing.T, dir, s string) []string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	var out []string
	for _, f := range files {
		if data, err := os.ReadFile(f); err == nil && strings.Contains(string(data), s) {
			out = append(out, filepath.Base(f))
		}
	}
	return out
}
