// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// The agent as operators run it: the chart's DaemonSet pod, from the image
// hack/build-image.sh builds, with the chart's service account and RBAC.

// TestAgentPodRollingUpdate: `helm upgrade` to a new image rolls the
// agent pod while a pod with a MIG claim keeps running. The new agent
// starts beside the old one, asks it to hand the node over, serves, and
// only then is the old pod deleted; the running pod is untouched (same
// container, no restart, its MIG instance in place), and its claim
// unprepares cleanly afterwards through the new agent: the MIG instance
// destroyed, the CDI spec and the checkpoint entry gone.
func TestAgentPodRollingUpdate(t *testing.T) {
	s, mockDir, values := startLastingAgentPod(t, "rolling", oneH100)
	n, ctx, ns, old := s.n, s.ctx, s.ns, s.agent
	initial, err := persist.ReadState(mockDir)
	if err != nil {
		t.Fatal(err)
	}
	r := s.runPod("mig", s.template(exampleClaim(t, "mig-1g.10gb.yaml")), "rolling-update mig pod")
	withPod, err := persist.ReadState(mockDir)
	if err != nil {
		t.Fatal(err)
	}
	if framework.HardwareDiff(initial, withPod) == "" {
		t.Fatal("the MIG pod runs, but the mock hardware shows no change")
	}
	container := r.pod.Status.ContainerStatuses[0].ContainerID
	// The image as the kubelet reports it: pulled from the suite's
	// registry by tag, resolved to the pushed index (amd64 and arm64).
	checkAgentImage(t, n, old, framework.AgentImageTag)

	values["image"].(map[string]any)["tag"] = framework.AgentImageTagNext
	began := time.Now()
	pod, err := n.UpgradeAgent(ctx, values, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	framework.Timing(t, "agent_rolling_update", time.Since(began))
	if pod.UID == old.UID {
		t.Fatalf("helm upgrade left the agent pod %s in place", pod.Name)
	}
	checkAgentImage(t, n, pod, framework.AgentImageTagNext)
	for _, want := range []string{`version="` + framework.AgentImageTagNext + `"`, "Took over the node from the previous agent"} {
		if err := pod.WaitLog(ctx, want, 10*time.Second); err != nil {
			t.Errorf("%v\n%s", err, pod.Tail(30))
		}
	}

	// The running pod did not notice.
	p, err := n.Admin.CoreV1().Pods(ns).Get(ctx, "mig", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 ||
		p.Status.ContainerStatuses[0].ContainerID != container || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the MIG pod changed during the rolling update: %+v", p.Status)
	}
	if now, err := persist.ReadState(mockDir); err != nil || framework.HardwareDiff(withPod, now) != "" {
		t.Errorf("the hardware changed during the rolling update (%v):\n%s", err, framework.HardwareDiff(withPod, now))
	}
	recs, err := framework.ReadAgentRecords(n.AgentPodStateDir(), gpuDriver)
	if err != nil || recs.Claims[string(r.claim.UID)] == "" {
		t.Errorf("the new agent's checkpoint lacks the claim %s: %+v %v", r.claim.UID, recs, err)
	}

	// The claim unprepares through the new agent, completely.
	s.deletePod("mig")
	waitCDISpecGone(t, n, gpuDriver, r.claim)
	if _, err := framework.WaitMockState(ctx, mockDir, 30*time.Second, "as before the MIG pod", func(st persist.State) bool {
		return framework.HardwareDiff(initial, st) == ""
	}); err != nil {
		t.Error(err)
	}
	if recs, err := framework.ReadAgentRecords(n.AgentPodStateDir(), gpuDriver); err != nil || len(recs.Claims) != 0 || len(recs.Ledger) != 0 {
		t.Errorf("the agent still records claims or instances after the unprepare: %+v %v", recs, err)
	}
}

// startLastingAgentPod starts the agent pod on mock hardware (a profile's
// YAML) that outlives it, as a GPU outlives its driver: the mock's state
// in the pod's state directory (a host path). It returns the scenario (a
// namespace whose pods and claims are gone when t ends), the mock's
// directory and the chart values (to upgrade with).
func startLastingAgentPod(t *testing.T, name, profile string) (*scenario, string, map[string]any) {
	t.Helper()
	return startLastingAgentPodWith(t, name, profile, nil)
}

// startLastingAgentPodWith is startLastingAgentPod with the agent's
// configuration (the chart's config value: an AgentConfig without
// apiVersion and kind); nil: none.
func startLastingAgentPodWith(t *testing.T, name, profile string, config map[string]any) (*scenario, string, map[string]any) {
	t.Helper()
	n := framework.Shared(t)
	ctx := context.Background()
	values := n.AgentPodValues(t, framework.MockProfile(t, "lasting", profile))
	mockDir := framework.MockDirOf(values)
	if config != nil {
		values["config"] = config
	}

	since := n.KubeletLogSize()
	agent := n.StartAgentPod(t, values)
	if _, err := n.WaitPoolsComplete(ctx, gpuDriver, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitDriverRegistered(ctx, gpuDriver, since, 15*time.Second); err != nil {
		t.Logf("NOTE: %v", err)
	}
	ns := n.CreateNamespace(t, name)
	t.Cleanup(func() {
		if err := n.DeletePodsAndClaims(context.Background(), ns, 90*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return &scenario{t: t, n: n, ns: ns, ctx: ctx, agent: agent}, mockDir, values
}

// TestAgentPodCredentials: the agent pod authenticates with the token the
// kubelet projected for it: the chart's service account, bound to the
// pod's node. With that token its writes outside its rights are refused:
// slices of another node, of another driver or of no node (the admission
// policy), and what RBAC does not grant (secrets, pods, nodes); its own
// work is allowed.
func TestAgentPodCredentials(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	pod := n.StartAgentPod(t, n.AgentPodValues(t, framework.MockProfile(t, "one-h100", oneH100)))
	c, err := pod.Client()
	if err != nil {
		t.Fatal(err)
	}
	review, err := c.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ui := review.Status.UserInfo
	if ui.Username != "system:serviceaccount:"+framework.AgentNamespace+":"+framework.AgentServiceAccount ||
		strings.Join(ui.Extra["authentication.kubernetes.io/node-name"], ",") != n.Name {
		t.Fatalf("the agent pod is %s with %v, want the chart's service account bound to node %s", ui.Username, ui.Extra, n.Name)
	}
	other := fakeNode(t, n, "other-node-pod")
	for _, tc := range []struct {
		name   string
		do     func() error
		reason string
	}{
		{"slice of another node", func() error {
			_, err := c.ResourceV1().ResourceSlices().Create(ctx, slice("e2e-pod-other", gpuDriver, other), metav1.CreateOptions{})
			return err
		}, "may not write ResourceSlices of node 'other-node-pod'"},
		{"slice of another driver", func() error {
			_, err := c.ResourceV1().ResourceSlices().Create(ctx, slice("e2e-pod-driver", "gpu.example.com", n.Name), metav1.CreateOptions{})
			return err
		}, "driver 'gpu.example.com'"},
		{"slice of all nodes", func() error {
			_, err := c.ResourceV1().ResourceSlices().Create(ctx, slice("e2e-pod-all", gpuDriver, ""), metav1.CreateOptions{})
			return err
		}, "no node"},
		{"slice of another node's pool", func() error {
			s := slice("e2e-pod-pool", gpuDriver, n.Name)
			s.Spec.Pool.Name = other
			_, err := c.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{})
			return err
		}, "not of pool '" + other + "'"},
		{"read secrets", func() error {
			_, err := c.CoreV1().Secrets(framework.AgentNamespace).List(ctx, metav1.ListOptions{})
			return err
		}, "forbidden"},
		{"delete pods", func() error {
			return c.CoreV1().Pods(framework.AgentNamespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
		}, "forbidden"},
		{"change its node", func() error {
			_, err := c.CoreV1().Nodes().Patch(ctx, n.Name, "application/merge-patch+json", []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
			return err
		}, "forbidden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if err == nil {
				t.Fatal("allowed, want refused")
			}
			if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("%v; want a refusal mentioning %q", err, tc.reason)
			}
		})
	}
	// What it does: read claims and its node, publish its node's slices.
	if _, err := c.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
		t.Errorf("list claims: %v", err)
	}
	if _, err := c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("get its node: %v", err)
	}
	own := slice("e2e-pod-own", gpuDriver, n.Name)
	if _, err := c.ResourceV1().ResourceSlices().Create(ctx, own, metav1.CreateOptions{}); err != nil {
		t.Errorf("create a slice of its node: %v", err)
	} else if err := c.ResourceV1().ResourceSlices().Delete(ctx, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete it: %v", err)
	}
}

// agentPodResidentTarget is the operator guide's target
// (docs/operator-guide.md, Memory): the agent pod on a mock DGX H100
// "stays under 60 MiB resident", the resident memory of the agent process
// in the pod's cgroup.
const agentPodResidentTarget = 60 << 20

// TestAgentPodMemory holds the agent pod on a mock DGX H100 (8 GPUs, 8
// NICs, 218 devices) to the operator guide's target once it serves: under
// 60 MiB resident. It logs "MEMORY agent-pod dgx-h100 ..." and fails with the
// measured figures when over.
func TestAgentPodMemory(t *testing.T) {
	m := agentPodMemory(t)
	t.Logf("MEMORY agent-pod dgx-h100 %s", m)
	if m.Resident() >= agentPodResidentTarget {
		t.Errorf("the agent pod's agent is %.1f MiB resident, over the operator guide's target (under %d MiB): %s",
			float64(m.Resident())/(1<<20), agentPodResidentTarget>>20, m)
	}
}

// BenchmarkAgentPodMemory reports the agent pod's resident memory on a
// mock DGX H100 once it serves (the process in the pod's cgroup; target
// under 60 MiB), its anonymous part and the cgroup's whole charge:
// hack/e2e-realnode.sh -run '^$' -bench AgentPodMemory
func BenchmarkAgentPodMemory(b *testing.B) {
	m := agentPodMemory(b)
	for b.Loop() {
	}
	b.ReportMetric(float64(m.Resident())/(1<<20), "resident-MiB")
	b.ReportMetric(float64(m.RssAnon)/(1<<20), "anon-MiB")
	b.ReportMetric(float64(m.Usage)/(1<<20), "cgroup-MiB")
	b.Logf("MEMORY agent-pod dgx-h100 %s", m)
}

// agentPodMemory starts the agent pod on a mock DGX H100 and reads its
// memory once both drivers' pools are published and its resident memory
// has stopped falling.
func agentPodMemory(tb testing.TB) framework.Memory {
	tb.Helper()
	n := framework.Shared(tb)
	pod := n.StartAgentPod(tb, n.AgentPodValues(tb, "mock:dgx-h100"))
	for _, d := range []string{gpuDriver, nicDriver} {
		if _, err := n.WaitPoolsComplete(context.Background(), d, 60*time.Second); err != nil {
			tb.Fatal(err)
		}
	}
	// Start-up's garbage leaves the resident set when the Go runtime has
	// collected it and its scavenger has returned the pages, and the
	// agent offers no way to make either happen or to see them end (no
	// debug endpoint; its /metrics counts GC cycles, but at rest the
	// runtime may force one only after two minutes). So sample until
	// resident memory has made no new low for settle, within a minute,
	// and report the last sample.
	const every, settle, limit = 500 * time.Millisecond, 5 * time.Second, time.Minute
	m, err := pod.Memory()
	if err != nil {
		tb.Fatal(err)
	}
	low, lowAt := m.Resident(), time.Now()
	for began := time.Now(); time.Since(lowAt) < settle; {
		if time.Since(began) > limit {
			tb.Logf("resident memory still falling after %v: %s", limit, m)
			break
		}
		// Sampled over real time: the reading is of memory that stopped
		// falling for settle, so time must pass between samples.
		time.Sleep(every)
		if m, err = pod.Memory(); err != nil {
			tb.Fatal(err)
		}
		if m.Resident() < low {
			low, lowAt = m.Resident(), time.Now()
		}
	}
	return m
}

// checkAgentImage: the agent pod's container runs the image pushed as tag,
// as the pod's status says (the kubelet's image ID is the repository
// digest the node pulled: the index's, for a multi-platform tag).
func checkAgentImage(t *testing.T, n *framework.Node, agent *framework.AgentPod, tag string) {
	t.Helper()
	p, err := n.Admin.CoreV1().Pods(framework.AgentNamespace).Get(context.Background(), agent.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := framework.AgentImageRepository + "@" + framework.AgentImageDigests[tag]
	if len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].ImageID != want ||
		p.Status.ContainerStatuses[0].Image != framework.AgentImageRepository+":"+tag {
		t.Errorf("agent pod %s: container status %+v, want image %s:%s, image ID %s", p.Name, p.Status.ContainerStatuses, framework.AgentImageRepository, tag, want)
	}
}
