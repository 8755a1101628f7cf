// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/mock/drivertools"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// Sharing a GPU among pods: GPU shares that independent claims take, and
// one claim shared through MPS. The MPS control daemons are the mock
// driver's stand-in (mock/drivertools), started by the agent pod from
// its driver root in the node's PID namespace; their directories are
// under the agent's state directory, a host path the test reads.

// mpsPaths are what a container of an MPS client shows: the daemon's
// pipe directory (its PID file), and /dev: the GPU's nodes and /dev/shm
// (the daemon's marker).
var mpsPaths = []string{"/tmp/nvidia-mps", "/dev"}

// gpuShareClaim is deploy/examples/gpu-share.yaml asking for other amounts.
func gpuShareClaim(t *testing.T, name, memory, compute string) *resourceapi.ResourceClaim {
	t.Helper()
	c := exampleClaim(t, "gpu-share.yaml")
	c.Name = name
	c.Spec.Devices.Requests[0].Exactly.Capacity.Requests = map[resourceapi.QualifiedName]resource.Quantity{
		gpuDriver + "/memory": resource.MustParse(memory), gpuDriver + "/compute": resource.MustParse(compute),
	}
	return c
}

// mpsClient checks what a container of an MPS client got: the pipe
// directory in CUDA_MPS_PIPE_DIRECTORY and mounted, the daemon's /dev/shm,
// and its limits. It returns the PID of the daemon it reaches.
func mpsClient(t *testing.T, name string, r ran, threads, memLimit string) string {
	t.Helper()
	env := r.out.Env
	if env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" || env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != threads || env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != memLimit {
		t.Errorf("%s: MPS environment %q %q %q, want /tmp/nvidia-mps, %s, %s", name,
			env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], threads, memLimit)
	}
	pid := strings.TrimSpace(r.out.Files["/tmp/nvidia-mps/"+drivertools.PIDFile])
	if pid == "" {
		t.Fatalf("%s: no daemon PID file in the mounted pipe directory:\n%s", name, r.logs)
	}
	if !strings.Contains(r.logs, "=== OTHER /tmp/nvidia-mps/control ") {
		t.Errorf("%s: the daemon's control socket is not in the container's pipe directory:\n%s", name, r.logs)
	}
	marker := "/dev/shm/" + drivertools.ShmMarkerPrefix + pid
	if _, ok := r.out.Files[marker]; !ok {
		t.Errorf("%s: the container's /dev/shm is not the daemon's (no %s):\n%s", name, marker, r.logs)
	}
	return pid
}

// daemonLogs reads what every MPS daemon under the agent pod's state was
// told, by daemon directory.
func daemonLogs(t *testing.T, n *framework.Node) map[string][]drivertools.MPSEvent {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(n.AgentPodStateDir(), "mps", "*", "log"))
	out := map[string][]drivertools.MPSEvent{}
	for _, d := range dirs {
		ev, err := drivertools.MPSLog(d)
		if err != nil {
			t.Errorf("daemon log %s: %v", d, err)
		}
		out[filepath.Base(filepath.Dir(d))] = ev
	}
	return out
}

// running reports whether the process pid runs (the suite shares the
// node's PID namespace).
func running(pid string) bool {
	data, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return false
	}
	// A zombie no longer serves anyone.
	_, rest, _ := strings.Cut(string(data), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// waitGone waits until the process pid no longer runs.
func waitGone(ctx context.Context, pid string, timeout time.Duration) bool {
	return waitfor.Until(ctx, "process "+pid+" gone", timeout, func() bool { return !running(pid) }) == nil
}

// TestPodsGPUShares: on one H100, two pods with independent share claims
// (20Gi and 40%, 10Gi and 30%) run on the GPU's one share device; each
// container sees the GPU's MPS pipe directory and /dev/shm and its own
// limits, and both reach the same daemon. A MIG pod for that GPU stays
// Pending while the shares exist and runs once they are gone; the daemon
// stopped with the last share.
func TestPodsGPUShares(t *testing.T) {
	s := startScenario(t, "pods-gpu-shares", framework.MockProfile(t, "one-h100", oneH100), gpuDriver)
	type share struct{ name, memory, compute, threads, limit string }
	var pids []string
	var device string
	for _, sh := range []share{{"share-a", "20Gi", "40", "40", "0=20480M"}, {"share-b", "10Gi", "30", "30", "0=10240M"}} {
		tmpl := s.template(gpuShareClaim(t, sh.name, sh.memory, sh.compute))
		r := s.runPod(sh.name, tmpl, "gpu-share", mpsPaths...)
		res := result(t, r.claim, "gpu")
		if res.ShareID == nil || !strings.HasSuffix(res.Device, "-share") {
			t.Errorf("%s: allocated %s, share %v", sh.name, res.Device, res.ShareID)
		}
		if device != "" && res.Device != device {
			t.Errorf("%s: share of %s, the other of %s", sh.name, res.Device, device)
		}
		device = res.Device
		if spec := checkCDI(t, s.n, gpuDriver, r); spec == nil {
			t.Fatalf("%s: no CDI spec", sh.name)
		}
		pids = append(pids, mpsClient(t, sh.name, r, sh.threads, sh.limit))
	}
	if pids[0] != pids[1] || !running(pids[0]) {
		t.Errorf("the shares reach daemons %v (running: %v), want one", pids, running(pids[0]))
	}
	logs := daemonLogs(t, s.n)
	if len(logs) != 1 {
		t.Errorf("%d MPS daemons, want the GPU's one: %v", len(logs), logs)
	}

	// The shares hold the GPU's counters: no MIG partition until they go.
	mig := "mig"
	since := s.createPod(mig, s.template(exampleClaim(t, "mig-1g.10gb.yaml")))
	msg := s.waitPending(mig)
	t.Logf("the MIG pod waits: %s", msg)
	for _, name := range []string{"share-a", "share-b"} {
		s.deletePod(name)
	}
	if !waitGone(s.ctx, pids[0], 30*time.Second) {
		t.Errorf("the MPS daemon %s still runs after its last share went", pids[0])
	}
	r := s.waitRunning(mig, "mig after shares", since)
	t.Logf("the MIG pod runs on %s once the shares are gone", result(t, r.claim, "mig").Device)
	for id, ev := range daemonLogs(t, s.n) {
		if len(ev) == 0 || ev[len(ev)-1].Event != "exit" || ev[len(ev)-1].Reply != "quit" {
			t.Errorf("daemon %s was not told to quit: %+v", id, ev)
		}
	}
}

// TestPodsMPSClaimAcrossAgentRestarts: one claim with the MPS sharing
// strategy (deploy/examples/gpu-mps.yaml) shared by two pods; both reach
// its daemon with the claim's limits. The agent pod is rolled to a new
// image (helm upgrade) and then restarted (its pod deleted); the pods keep
// running, with the same containers, and their daemon keeps running (same
// PID), adopted by each new agent. Deleting the pods stops the daemon
// (told to quit) and leaves no record of it.
func TestPodsMPSClaimAcrossAgentRestarts(t *testing.T) {
	s, _, values := startLastingAgentPod(t, "mps-claim", oneH100)
	n, ctx, ns, agent := s.n, s.ctx, s.ns, s.agent

	claim := exampleClaim(t, "gpu-mps.yaml")
	claim.Namespace = ns
	if _, err := n.Admin.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := []string{"mps-a", "mps-b"}
	containers := map[string]string{}
	var pid string
	for _, name := range pods {
		r := s.waitRunning(name, "mps-claim pod", s.createPodFor(framework.PodWithClaim(name, claim.Name, mpsPaths...)))
		p := mpsClient(t, name, r, "50", "0=16384M")
		if pid != "" && p != pid {
			t.Errorf("%s reaches daemon %s, the other pod %s", name, p, pid)
		}
		pid = p
		containers[name] = r.pod.Status.ContainerStatuses[0].ContainerID
	}
	if !running(pid) {
		t.Fatalf("the claim's MPS daemon %s does not run", pid)
	}
	unchanged := func(when string) {
		t.Helper()
		for _, name := range pods {
			p, err := n.Admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 ||
				p.Status.ContainerStatuses[0].ContainerID != containers[name] || p.Status.ContainerStatuses[0].RestartCount != 0 {
				t.Errorf("%s: pod %s changed: %+v", when, name, p.Status)
			}
		}
		if !running(pid) {
			t.Errorf("%s: the MPS daemon %s is gone", when, pid)
		}
		for id, ev := range daemonLogs(t, n) {
			starts := slices.IndexFunc(ev, func(e drivertools.MPSEvent) bool { return e.Event == "start" && strconv.Itoa(e.PID) != pid })
			if starts >= 0 || len(ev) > 0 && ev[len(ev)-1].Event == "exit" {
				t.Errorf("%s: daemon %s was stopped or started again: %+v", when, id, ev)
			}
		}
	}

	values["image"].(map[string]any)["tag"] = framework.AgentImageTagNext
	began := time.Now()
	rolled, err := n.UpgradeAgent(ctx, values, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	framework.Timing(t, "agent_rolling_update_with_mps", time.Since(began))
	if rolled.UID == agent.UID {
		t.Fatalf("helm upgrade left the agent pod %s in place", rolled.Name)
	}
	unchanged("after the rolling update")

	// A restart: the DaemonSet's pod deleted, and made again.
	if err := n.Admin.CoreV1().Pods(framework.AgentNamespace).Delete(ctx, rolled.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := waitNewAgentPod(ctx, n, rolled.UID, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	unchanged("after the agent pod's restart")

	for _, name := range pods {
		s.deletePod(name)
	}
	if err := n.Admin.ResourceV1().ResourceClaims(ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if !waitGone(ctx, pid, 60*time.Second) {
		t.Errorf("the MPS daemon %s still runs after its claim went", pid)
	}
	for id, ev := range daemonLogs(t, n) {
		if len(ev) == 0 || ev[len(ev)-1].Reply != "quit" {
			t.Errorf("daemon %s was not told to quit: %+v", id, ev)
		}
	}
	if recs, err := framework.ReadAgentRecords(n.AgentPodStateDir(), gpuDriver); err != nil || len(recs.Claims) != 0 {
		t.Errorf("the agent still records claims after the unprepare: %+v %v", recs, err)
	}
}

// waitNewAgentPod waits until the DaemonSet's pod on the node is another
// than old and ready.
func waitNewAgentPod(ctx context.Context, n *framework.Node, old types.UID, timeout time.Duration) (*framework.AgentPod, error) {
	var p *framework.AgentPod
	deadline := time.Now().Add(timeout)
	err := waitfor.Check(ctx, "a new agent pod, ready", timeout, func() error {
		var err error
		if p, err = n.WaitAgentRollout(ctx, time.Until(deadline)); err == nil && p.UID == old {
			err = errors.New("still the old pod")
		}
		return err
	})
	return p, err
}
