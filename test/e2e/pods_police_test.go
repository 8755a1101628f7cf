// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/mock/drivertools"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// The share police: the agent pod looks at the processes the mock GPU
// lists (set with `hwdra mock inject processes`: real PIDs of the test's
// pods, with the GPU memory a real GPU would report) and acts on those
// that overrun their share. What the test checks is what a user sees: the
// Event on the pod, the container's restart in the pod's status as the
// kubelet reports it, the neighbour's process and pod untouched.

// policeEvery is the interval the tests police at.
const policeEvery = 200

// policing is the chart's config value of an agent that polices shares
// every policeEvery ms, stopping or reporting.
func policing(overuse string) map[string]any {
	return map[string]any{"gpus": map[string]any{"shares": map[string]any{"overuse": overuse, "checkIntervalMilliseconds": policeEvery}}}
}

// raisedLimits is what a workload that rewrites its MPS limits starts with.
const raisedLimits = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=100000M;CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"

// runSharePod runs a test-app pod with a GPU share of its own; exec, if
// set, is the environment its app starts again with (TESTAPP_EXEC_ENV).
func (s *scenario) runSharePod(name, memory, compute, exec string) ran {
	s.t.Helper()
	pod := framework.PodWithClaimTemplate(name, s.template(gpuShareClaim(s.t, name, memory, compute)), mpsPaths...)
	if exec != "" {
		pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "TESTAPP_EXEC_ENV", Value: exec}}
	}
	return s.waitRunning(name, "police share pod", s.createPodFor(pod))
}

// appPID is the node's PID of a running pod's app: the process whose
// cgroup names the app container (the suite shares the node's PID
// namespace).
func appPID(t *testing.T, r ran) uint32 {
	t.Helper()
	_, id, _ := strings.Cut(r.pod.Status.ContainerStatuses[0].ContainerID, "://")
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cg, err := os.ReadFile(filepath.Join(d, "cgroup"))
		if err != nil || !strings.Contains(string(cg), id) {
			continue
		}
		// The image runs the test app as /app.
		if comm, _ := os.ReadFile(filepath.Join(d, "comm")); strings.TrimSpace(string(comm)) == "app" {
			pid, _ := strconv.ParseUint(filepath.Base(d), 10, 32)
			return uint32(pid)
		}
	}
	t.Fatalf("pod %s: no test app process in container %s", r.pod.Name, id)
	return 0
}

// gpuBusID is the mock's first GPU.
func gpuBusID(t *testing.T, mockDir string) string {
	t.Helper()
	st, err := persist.ReadState(mockDir)
	if err != nil || len(st.GPUs) == 0 {
		t.Fatalf("mock state: %v", err)
	}
	return st.GPUs[0].BusID
}

// listProcesses makes the mock GPU list these processes ("PID:MEMORY[:mps]").
func listProcesses(t *testing.T, mockDir, gpu string, procs ...string) {
	t.Helper()
	args := []string{"processes", "--gpu", gpu}
	for _, p := range procs {
		args = append(args, "--process", p)
	}
	hwdraInject(t, mockDir, args...)
}

// policeRounds is the rounds the agent pod's police has made
// (hwdra_gpu_share_check_duration_seconds_count).
func policeRounds(t *testing.T) int {
	t.Helper()
	v, err := framework.AgentMetric(framework.AgentAddr, "hwdra_gpu_share_check_duration_seconds_count")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(v)
	return n
}

// waitRounds waits until the police has made n rounds more than from:
// whatever it would do about the processes listed before, it has done.
func waitRounds(t *testing.T, from, n int) {
	t.Helper()
	waitfor.True(t, fmt.Sprintf("%d police rounds after round %d", n, from), 20*time.Second, func() bool { return policeRounds(t) >= from+n })
}

// waitRestarted waits until the pod's app container was killed (exit code
// 137, SIGKILL) and started again, as the kubelet reports it.
func (s *scenario) waitRestarted(name string) *corev1.Pod {
	s.t.Helper()
	pod, err := s.n.WaitPod(s.ctx, s.ns, name, 30*time.Second, "its app killed and restarted", func(p *corev1.Pod) bool {
		if len(p.Status.ContainerStatuses) == 0 {
			return false
		}
		c := p.Status.ContainerStatuses[0]
		return c.RestartCount >= 1 && c.LastTerminationState.Terminated != nil && c.LastTerminationState.Terminated.ExitCode == 137
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return pod
}

// untouched checks that pod name's app still runs as pid, never
// restarted, and no police Event names it.
func (s *scenario) untouched(name string, pid uint32) {
	s.t.Helper()
	if !running(fmt.Sprint(pid)) {
		s.t.Errorf("pod %s: its app (PID %d) no longer runs", name, pid)
	}
	pod, err := s.n.Admin.CoreV1().Pods(s.ns).Get(s.ctx, name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	if c := pod.Status.ContainerStatuses[0]; c.RestartCount != 0 {
		s.t.Errorf("pod %s: restarted %d times", name, c.RestartCount)
	}
	list, err := s.n.Admin.CoreV1().Events(s.ns).List(s.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, e := range list.Items {
		if strings.HasPrefix(e.Reason, "GPUShare") || strings.HasPrefix(e.Reason, "GPUProcess") {
			s.t.Errorf("pod %s: event %s: %s", name, e.Reason, e.Message)
		}
	}
}

// TestPodsGPUSharesPoliced: two share pods on one H100 (20Gi/40%,
// 10Gi/30%). The GPU lists the first pod's app with 24 GiB: the agent
// stops it (SIGKILL), the pod gets a Warning Event with the figures and
// the kubelet restarts its container (exit code 137); the neighbour's app
// runs on untouched. A third share pod whose app starts with its own MPS
// limits (100000M, 100%) is caught the same way, though it holds little
// memory.
func TestPodsGPUSharesPoliced(t *testing.T) {
	s, mockDir, _ := startLastingAgentPodWith(t, "shares-policed", oneH100, policing("Stop"))
	gpu := gpuBusID(t, mockDir)
	a := s.runSharePod("share-a", "20Gi", "40", "")
	b := s.runSharePod("share-b", "10Gi", "30", "")
	pidA, pidB := appPID(t, a), appPID(t, b)

	listed := time.Now()
	listProcesses(t, mockDir, gpu, fmt.Sprintf("%d:24Gi:mps", pidA), fmt.Sprintf("%d:9Gi:mps", pidB))
	ev := s.waitEvent("share-a", "GPU "+gpu, 20*time.Second)
	framework.Timing(t, "police-overrun-to-event", time.Since(listed))
	for _, want := range []string{"GPUShareMemoryOverrun", fmt.Sprintf("process %d of pod %s/share-a (container app)", pidA, s.ns), "24.0 GiB together", "its share is 20.0 GiB", "stopped"} {
		if !strings.Contains(ev, want) {
			t.Errorf("the overrunning pod's event %q lacks %q", ev, want)
		}
	}
	s.waitRestarted("share-a")
	if running(fmt.Sprint(pidA)) {
		t.Errorf("the overrunning app (PID %d) still runs", pidA)
	}
	s.untouched("share-b", pidB)

	// A client that starts with limits of its own above its share.
	c := s.runSharePod("share-c", "5Gi", "10", raisedLimits)
	if got := c.out.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]; got != "0=100000M" {
		t.Fatalf("the app of share-c started with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q, want its own 0=100000M", got)
	}
	pidC := appPID(t, c)
	listProcesses(t, mockDir, gpu, fmt.Sprintf("%d:9Gi:mps", pidB), fmt.Sprintf("%d:1Gi:mps", pidC))
	ev = s.waitEvent("share-c", "GPU "+gpu, 20*time.Second)
	for _, want := range []string{"GPUShareLimitsRaised", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT 97.7 GiB (its share: 5.0 GiB)", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE 100% (its share: 10%)", "stopped"} {
		if !strings.Contains(ev, want) {
			t.Errorf("the raised client's event %q lacks %q", ev, want)
		}
	}
	s.waitRestarted("share-c")
	s.untouched("share-b", pidB)
	listProcesses(t, mockDir, gpu)
}

// TestPodsGPUSharesReported: under gpus.shares.overuse Report a client
// with raised limits gets the Event and runs on: the police keeps
// checking (its rounds counted in the agent's metrics) and reports it
// once.
func TestPodsGPUSharesReported(t *testing.T) {
	s, mockDir, _ := startLastingAgentPodWith(t, "shares-reported", oneH100, policing("Report"))
	gpu := gpuBusID(t, mockDir)
	r := s.runSharePod("share-r", "10Gi", "30", raisedLimits)
	pid := appPID(t, r)
	listProcesses(t, mockDir, gpu, fmt.Sprintf("%d:30Gi:mps", pid))
	ev := s.waitEvent("share-r", "GPU "+gpu, 20*time.Second)
	if !strings.Contains(ev, "GPUShareLimitsRaised") || !strings.Contains(ev, "reported (gpus.shares.overuse: Report)") {
		t.Errorf("event %q, want the raised limits reported", ev)
	}
	// Three more rounds: still running, reported once (one finding per
	// process: its memory over the share is not reported apart).
	waitRounds(t, policeRounds(t), 3)
	if !running(fmt.Sprint(pid)) {
		t.Errorf("the reported app (PID %d) was stopped", pid)
	}
	list, err := s.n.Admin.CoreV1().Events(s.ns).List(s.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=share-r"})
	if err != nil {
		t.Fatal(err)
	}
	police := 0
	for _, e := range list.Items {
		if strings.HasPrefix(e.Reason, "GPUShare") {
			police++
			if e.Count > 1 || e.Series != nil && e.Series.Count > 1 {
				t.Errorf("event %s repeated: %+v", e.Reason, e)
			}
		}
	}
	if police == 0 {
		t.Error("no police event on the pod")
	}
	pod, err := s.n.Admin.CoreV1().Pods(s.ns).Get(s.ctx, "share-r", metav1.GetOptions{})
	if err != nil || pod.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the reported pod restarted: %v %+v", err, pod.Status.ContainerStatuses)
	}
	listProcesses(t, mockDir, gpu)
}

// TestPodsGPUSharesDedicated: a policed share (20Gi/40%) and a dedicated
// share (deploy/examples/gpu-share-dedicated.yaml, 10Gi/30%) on one H100
// run under two MPS daemons: the dedicated one's defaults are its share
// (read from what the daemon was told), the GPU's shares' daemon has none,
// and the GPU is in compute mode Default. The dedicated pod's app starts
// with limits of its own: its daemon holds it, so the police leaves it
// alone; listed outside MPS (a context of its own, which Default allows)
// it is stopped. A pod with no claim whose process is on the GPU is
// stopped too; the policed share's pod runs on throughout.
func TestPodsGPUSharesDedicated(t *testing.T) {
	s, mockDir, _ := startLastingAgentPodWith(t, "shares-dedicated", oneH100, policing("Stop"))
	gpu := gpuBusID(t, mockDir)
	p := s.runSharePod("policed", "20Gi", "40", "")
	pod := framework.PodWithClaimTemplate("dedicated", s.template(exampleClaim(t, "gpu-share-dedicated.yaml")), mpsPaths...)
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "TESTAPP_EXEC_ENV", Value: raisedLimits}}
	d := s.waitRunning("dedicated", "police dedicated share pod", s.createPodFor(pod))
	policedDaemon := mpsClient(t, "policed", p, "40", "0=20480M")
	if d.out.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=100000M" {
		t.Errorf("the dedicated pod's app started with %q, want its own 0=100000M", d.out.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	}
	dedicatedDaemon := strings.TrimSpace(d.out.Files["/tmp/nvidia-mps/"+drivertools.PIDFile])
	if dedicatedDaemon == "" || dedicatedDaemon == policedDaemon {
		t.Errorf("the dedicated share reaches daemon %q, the policed share %q: want one of its own", dedicatedDaemon, policedDaemon)
	}
	defaults := map[int][]string{}
	for _, ev := range daemonLogs(t, s.n) {
		var set []string
		pid := 0
		for _, e := range ev {
			if e.Event == "command" && strings.HasPrefix(e.Command, "set_default_") && !e.Failed {
				set = append(set, e.Command)
			}
			if e.Event == "start" {
				pid = e.PID
			}
		}
		defaults[pid] = set
	}
	if len(defaults) != 2 {
		t.Errorf("%d MPS daemons, want the GPU's shares' and the dedicated share's: %v", len(defaults), defaults)
	}
	want := []string{"set_default_active_thread_percentage 30", "set_default_device_pinned_mem_limit 0 10240M"}
	for pid, set := range defaults {
		switch fmt.Sprint(pid) {
		case dedicatedDaemon:
			if strings.Join(set, ";") != strings.Join(want, ";") {
				t.Errorf("the dedicated share's daemon was told %q, want %q", set, want)
			}
		case policedDaemon:
			if len(set) != 0 {
				t.Errorf("the policed shares' daemon was told %q, want no defaults", set)
			}
		}
	}
	if st, err := persist.ReadState(mockDir); err != nil || st.GPUs[0].ComputeMode != 0 {
		t.Errorf("the GPU's compute mode %d (%v), want Default (0) while a dedicated share is on it", st.GPUs[0].ComputeMode, err)
	}

	pidP, pidD := appPID(t, p), appPID(t, d)
	// Within its share, limits raised but held by its daemon: left alone.
	// The police's rounds are counted: three after the list, then judge.
	listProcesses(t, mockDir, gpu, fmt.Sprintf("%d:8Gi:mps", pidP), fmt.Sprintf("%d:4Gi:mps", pidD))
	waitRounds(t, policeRounds(t), 3)
	s.untouched("dedicated", pidD)

	// Outside MPS: a context of its own on the whole GPU.
	listProcesses(t, mockDir, gpu, fmt.Sprintf("%d:8Gi:mps", pidP), fmt.Sprintf("%d:40Gi", pidD))
	ev := s.waitEvent("dedicated", "GPU "+gpu, 20*time.Second)
	if !strings.Contains(ev, "GPUProcessOutsideMPS") || !strings.Contains(ev, "stopped") {
		t.Errorf("event %q, want the process outside MPS stopped", ev)
	}
	s.waitRestarted("dedicated")

	// A pod with no claim at all, its process on the GPU.
	s.createPodFor(framework.TestAppPod("stray"))
	strayPod, err := s.n.WaitPodRunning(s.ctx, s.ns, "stray", podRunningTimeout)
	if err != nil {
		t.Fatal(err)
	}
	pidS := appPID(t, ran{pod: strayPod})
	listProcesses(t, mockDir, gpu, fmt.Sprintf("%d:8Gi:mps", pidP), fmt.Sprintf("%d:1Gi", pidS))
	ev = s.waitEvent("stray", "GPU "+gpu, 20*time.Second)
	if !strings.Contains(ev, "GPUProcessWithoutClaim") || !strings.Contains(ev, "uses no claim prepared on that GPU") {
		t.Errorf("event %q, want the stray process stopped", ev)
	}
	s.waitRestarted("stray")
	s.untouched("policed", pidP)
	listProcesses(t, mockDir, gpu)
}
