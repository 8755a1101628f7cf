// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// threeH100 is a node with three H100 80GB, MIG off as shipped: one GPU
// for shares, one for an MPS claim, one for a time-slicing claim.
const threeH100 = `
gpus:
- model: h100-80gb
  count: 3
`

// settingsLeft is the chart's config value of an agent that leaves GPU
// settings to another tool.
var settingsLeft = map[string]any{"gpus": map[string]any{"settings": "Leave"}}

// TestPodsSharingWithSettingsLeft: the agent pod configured with
// gpus.settings: Leave on three H100s with MIG off publishes no MIG
// partition (each GPU its whole GPU and share device), runs the sharing
// examples without changing a GPU setting: two pods with GPU shares
// (gpu-share.yaml) and two pods of an MPS claim (gpu-mps.yaml) run, each
// container reaching its daemon with its limits, the GPUs staying in
// compute mode Default, and the agent's log saying once per GPU what that
// costs. A pod of a time-slicing claim (gpu-timeslicing.yaml) is
// scheduled but never starts: the kubelet's event on it carries the
// prepare error, which names the claim and the setting. The mock
// hardware counts every call: no MIG mode, compute mode or time slice
// call reached a GPU, while the pods ran nor after they went, and the
// hardware is as it was.
func TestPodsSharingWithSettingsLeft(t *testing.T) {
	s, mockDir, _ := startLastingAgentPodWith(t, "settings-left", threeH100, settingsLeft)
	n, ctx, ns := s.n, s.ctx, s.ns
	initial, err := persist.ReadState(mockDir)
	if err != nil {
		t.Fatal(err)
	}
	if types := s.gpuDeviceTypes(); !maps.Equal(types, map[string]int{"gpu": 3, "share": 3}) {
		t.Errorf("published device types %v, want 3 whole GPUs and 3 share devices and no MIG partition", types)
	}

	// GPU shares: each pod reaches the GPU's daemon, held to its share.
	var sharePIDs []string
	for _, sh := range []struct{ name, memory, compute, threads, limit string }{
		{"share-a", "20Gi", "40", "40", "0=20480M"}, {"share-b", "10Gi", "30", "30", "0=10240M"},
	} {
		r := s.runPod(sh.name, s.template(gpuShareClaim(t, sh.name, sh.memory, sh.compute)), "settings-left share", mpsPaths...)
		sharePIDs = append(sharePIDs, mpsClient(t, sh.name, r, sh.threads, sh.limit))
	}
	if sharePIDs[0] != sharePIDs[1] {
		t.Errorf("the shares reach daemons %v, want the GPU's one", sharePIDs)
	}

	// An MPS claim shared by two pods, under the claim's daemon.
	claim := exampleClaim(t, "gpu-mps.yaml")
	claim.Namespace = ns
	if _, err := n.Admin.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var mpsPID string
	for _, name := range []string{"mps-a", "mps-b"} {
		r := s.waitRunning(name, "settings-left mps-claim pod", s.createPodFor(framework.PodWithClaim(name, claim.Name, mpsPaths...)))
		if pid := mpsClient(t, name, r, "50", "0=16384M"); mpsPID != "" && pid != mpsPID {
			t.Errorf("%s reaches daemon %s, the other pod %s", name, pid, mpsPID)
		} else {
			mpsPID = pid
		}
	}
	if mpsPID == sharePIDs[0] {
		t.Errorf("the MPS claim and the shares reach one daemon %s", mpsPID)
	}
	if got := strings.Count(s.agent.Log(), "MPS serves a GPU in compute mode Default"); got != 2 {
		t.Errorf("the agent explained compute mode Default under MPS %d times, want once per GPU (2)\n%s", got, s.agent.Tail(30))
	}

	// Time-slicing: allocated, refused at prepare, never running.
	ts := "timeslicing"
	s.createPod(ts, s.template(exampleClaim(t, "gpu-timeslicing.yaml")))
	event := s.waitEvent(ts, "gpus.settings: Leave", 60*time.Second)
	for _, want := range []string{"claim " + ns + "/", `sharing.strategy: Invalid value: "TimeSlicing"`, "leave sharing out"} {
		if !strings.Contains(event, want) {
			t.Errorf("the prepare error %q does not say %q", event, want)
		}
	}
	s.checkNotStarted(ts, "gpus.settings: Leave")

	now, err := persist.ReadState(mockDir)
	if err != nil {
		t.Fatal(err)
	}
	checkSettingsLeft(t, "while the pods run", initial, now)

	for _, name := range []string{"share-a", "share-b", "mps-a", "mps-b", ts} {
		s.deletePod(name)
	}
	if err := n.Admin.ResourceV1().ResourceClaims(ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []string{sharePIDs[0], mpsPID} {
		if !waitGone(ctx, pid, 60*time.Second) {
			t.Errorf("the MPS daemon %s still runs after its claims went", pid)
		}
	}
	after, err := framework.WaitMockState(ctx, mockDir, 30*time.Second, "as before the pods", func(st persist.State) bool {
		return framework.HardwareDiff(initial, st) == ""
	})
	if err != nil {
		t.Error(err)
	}
	checkSettingsLeft(t, "after the pods went", initial, after)
	if recs, err := framework.ReadAgentRecords(n.AgentPodStateDir(), gpuDriver); err != nil || len(recs.Claims) != 0 || len(recs.Ledger) != 0 {
		t.Errorf("the agent still records claims or settings: %+v %v", recs, err)
	}
}

// checkSettingsLeft fails where a GPU's MIG mode, compute mode or time
// slice in now differs from before, or where any such call reached a GPU
// at all (a setting changed and restored leaves the state as it was; the
// mock counts the calls).
func checkSettingsLeft(t *testing.T, when string, before, now persist.State) {
	t.Helper()
	if calls := persist.SettingCalls(now.Calls); len(calls) != 0 {
		t.Errorf("%s: setting calls reached the GPUs: %v", when, calls)
	}
	for _, b := range before.GPUs {
		g, ok := now.GPU(b.BusID)
		if !ok {
			t.Errorf("%s: GPU %s is gone", when, b.BusID)
			continue
		}
		if g.MIG != b.MIG || g.ComputeMode != b.ComputeMode || g.TimeSlice != b.TimeSlice {
			t.Errorf("%s: GPU %s has MIG %+v, compute mode %d, time slice %d; had %+v, %d, %d",
				when, b.BusID, g.MIG, g.ComputeMode, g.TimeSlice, b.MIG, b.ComputeMode, b.TimeSlice)
		}
	}
}

// gpuDeviceTypes counts the GPU devices the node publishes by their type
// attribute (gpu, share, mig, ...).
func (s *scenario) gpuDeviceTypes() map[string]int {
	s.t.Helper()
	list, err := s.n.Admin.ResourceV1().ResourceSlices().List(s.ctx, metav1.ListOptions{
		FieldSelector: "spec.nodeName=" + s.n.Name + ",spec.driver=" + gpuDriver,
	})
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[string]int{}
	for _, sl := range list.Items {
		for _, d := range sl.Spec.Devices {
			if a, ok := d.Attributes[gpuDriver+"/type"]; ok && a.StringValue != nil {
				out[*a.StringValue]++
			}
		}
	}
	return out
}

// checkNotStarted waits until the kubelet has tried to start the pod
// again and been refused again (the refusal event with want seen twice:
// its count, as the kubelet aggregates a repeated event), then checks that
// the pod, bound to the node, is still Pending with no container running.
func (s *scenario) checkNotStarted(name, want string) {
	s.t.Helper()
	waitfor.NoError(s.t, "pod "+name+": the kubelet trying again, refused again", 90*time.Second, func() error {
		list, err := s.n.Admin.CoreV1().Events(s.ns).List(s.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			s.t.Fatal(err)
		}
		refused := int32(0)
		for _, e := range list.Items {
			if strings.Contains(e.Message, want) {
				refused += max(e.Count, 1)
			}
		}
		if refused < 2 {
			return fmt.Errorf("refused %d times", refused)
		}
		return nil
	})
	p, err := s.n.Admin.CoreV1().Pods(s.ns).Get(s.ctx, name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running != nil {
			s.t.Fatalf("pod %s started: containers %+v", name, p.Status.ContainerStatuses)
		}
	}
	if p.Status.Phase != corev1.PodPending {
		s.t.Fatalf("pod %s: phase %s, want Pending", name, p.Status.Phase)
	}
}
