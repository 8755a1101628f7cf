// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package police

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/internal/hw"
)

// node is a test's GPU with processes: real child processes (so that a
// stop is a real SIGKILL through a pidfd), seen through a /proc of the
// test's making that puts each in a pod's cgroup.
type node struct {
	t        testing.TB
	procRoot string
	mu       sync.Mutex
	listed   []hw.GPUProcess
	pods     map[types.UID]*corev1.Pod
	claims   []Claim
	found    []string
	made     int
}

func newNode(t testing.TB) *node {
	return &node{t: t, procRoot: t.TempDir(), pods: map[types.UID]*corev1.Pod{}}
}

func (n *node) GPUClaims() []Claim { return n.claims }

func (n *node) GPUProcesses(string) ([]hw.GPUProcess, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.listed, nil
}

func (n *node) PodByUID(uid types.UID) (*corev1.Pod, bool) { p, ok := n.pods[uid]; return p, ok }

func (n *node) Found(r Reason, action string) { n.found = append(n.found, string(r)+" "+action) }
func (n *node) Checked(int, time.Duration)    {}

// pod adds a pod whose container "app" uses claim (none: no claim).
func (n *node) pod(name, claim string) *corev1.Pod {
	n.made++
	uid := types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", n.made))
	p := &corev1.Pod{}
	p.Namespace, p.Name, p.UID = "ns", name, uid
	c := corev1.Container{Name: "app"}
	if claim != "" {
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}}
		c.Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	}
	p.Spec.Containers = []corev1.Container{c}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://" + strings.Repeat(fmt.Sprintf("%x", n.made%16), 64)}}
	n.pods[uid] = p
	return p
}

// run starts a process of pod p (nil: of no pod) with environment env,
// listed on the GPU holding mem GiB. It lives longer than any test here
// (killed at cleanup): a process that ended under a loaded race run
// left TestTenantFatEnvironments with 36 of its 40 to read.
func (n *node) run(p *corev1.Pod, mps bool, memGiB uint64, env ...string) *exec.Cmd {
	cmd := exec.Command("sleep", "600")
	cmd.Env = env
	n.start(cmd, p)
	n.list(cmd, mps, memGiB)
	return cmd
}

// start starts cmd as a process of pod p (nil: of no pod): the test's
// /proc shows it as the kernel does (its stat, comm and environ are the
// real ones: the environment is the process's live memory), in the
// pod's cgroup.
func (n *node) start(cmd *exec.Cmd, p *corev1.Pod) {
	n.t.Helper()
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	execed(n.t, cmd)
	n.place(cmd.Process.Pid, p)
}

// execed waits until cmd's process runs its program with its
// environment: between fork and exec /proc shows the test's environment,
// and for a moment after the exec an empty one (the kernel names the
// task before it sets up the new stack). A real GPU process is listed by
// NVML only once it has a CUDA context, long after.
func execed(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	var want []byte // built once: a 6 MB environment appended string by string is 150 MB of copying
	for _, e := range cmd.Env {
		want = append(append(want, e...), 0)
	}
	running := func() bool {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
		if err != nil || strings.TrimSpace(string(comm)) != filepath.Base(cmd.Path) {
			return false
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", cmd.Process.Pid))
		return err == nil && (cmd.Env == nil || bytes.Equal(env, want))
	}
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return running(), nil
	})
	if err != nil {
		t.Fatalf("%s did not start its program: %v", cmd.Path, err)
	}
}

// place makes the test's /proc show PID pid as a process of pod p.
func (n *node) place(pid int, p *corev1.Pod) {
	n.t.Helper()
	dir := filepath.Join(n.procRoot, fmt.Sprint(pid))
	if err := os.RemoveAll(dir); err != nil {
		n.t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		n.t.Fatal(err)
	}
	for _, name := range []string{"stat", "comm", "environ"} {
		if err := os.Symlink(fmt.Sprintf("/proc/%d/%s", pid, name), filepath.Join(dir, name)); err != nil {
			n.t.Fatal(err)
		}
	}
	cgroup := "0::/system.slice/some.service\n"
	if p != nil {
		_, id, _ := strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
		cgroup = fmt.Sprintf("0::/kubepods/burstable/pod%s/%s\n", p.UID, id)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

// list lists cmd's process on the GPU, holding mem GiB.
func (n *node) list(cmd *exec.Cmd, mps bool, memGiB uint64) {
	n.mu.Lock()
	n.listed = append(n.listed, hw.GPUProcess{PID: uint32(cmd.Process.Pid), UsedMemory: gb(memGiB), MPS: mps})
	n.mu.Unlock()
}

func shareEnv(memMiB, threads int) []string {
	return []string{fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM", memMiB), fmt.Sprintf("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%d", threads)}
}

// stopped waits for p to end, reports whether it died of SIGKILL.
func stopped(p *os.Process) bool {
	done := make(chan *os.ProcessState, 1)
	go func() { st, _ := p.Wait(); done <- st }()
	select {
	case st := <-done:
		if st == nil {
			return false
		}
		ws, ok := st.Sys().(syscall.WaitStatus)
		return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
	case <-time.After(10 * time.Second):
		return false
	}
}

// unkilled says why cmd's process is not running untouched: it exited
// (a zombie: nobody waits for it here) or a SIGKILL is pending for it (sent,
// not yet delivered); nil if neither. A signal sent through a pidfd is
// pending when the call returns, so this tells at once.
func unkilled(cmd *exec.Cmd) error {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		return err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "State":
			if strings.HasPrefix(v, "Z") || strings.HasPrefix(v, "X") {
				return fmt.Errorf("exited (%s)", v)
			}
		case "SigPnd", "ShdPnd":
			if mask, err := strconv.ParseUint(v, 16, 64); err == nil && mask&(1<<(syscall.SIGKILL-1)) != 0 {
				return fmt.Errorf("SIGKILL pending (%s %s)", k, v)
			}
		}
	}
	return nil
}

func events_(r *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestWatcherStops: two shares on a GPU; one's process holds more than the
// share and is stopped with an Event on its pod naming the figures; the
// neighbour's process, and the share's other process, run on.
func TestWatcherStops(t *testing.T) {
	n := newNode(t)
	n.claims = []Claim{
		{Namespace: "ns", Name: "a", GPU: "g", Share: &Share{Memory: 20 * gib, Compute: 40}},
		{Namespace: "ns", Name: "b", GPU: "g", Share: &Share{Memory: 10 * gib, Compute: 30}},
	}
	pa, pb := n.pod("pa", "a"), n.pod("pb", "b")
	small := n.run(pa, true, 6, shareEnv(20480, 40)...)
	big := n.run(pa, true, 18, shareEnv(20480, 40)...)
	neighbour := n.run(pb, true, 9, shareEnv(10240, 30)...)
	rec := events.NewFakeRecorder(10)
	w := New(Options{Claims: n, Processes: n, Pods: n, Stop: true, Events: rec, Observer: n, ProcRoot: n.procRoot, Interval: time.Hour})
	w.Check(context.Background())
	if !stopped(big.Process) {
		t.Fatal("the process that took the share over its memory was not stopped")
	}
	if err := unkilled(small); err != nil {
		t.Errorf("the share's other process: %v", err)
	}
	if err := unkilled(neighbour); err != nil {
		t.Errorf("the neighbour's process: %v", err)
	}
	got := events_(rec)
	if len(got) != 1 || !strings.Contains(got[0], "Warning GPUShareMemoryOverrun") || !strings.Contains(got[0], "pod ns/pa (container app)") ||
		!strings.Contains(got[0], "24.0 GiB together") || !strings.Contains(got[0], "stopped") {
		t.Errorf("events %q", got)
	}
	if len(n.found) != 1 || n.found[0] != "GPUShareMemoryOverrun stopped" {
		t.Errorf("counted %q", n.found)
	}
}

// TestWatcherReports: under Report the process runs on, its Event is
// posted once however many rounds see it, and a process outside
// Kubernetes is reported on the node and never stopped even under Stop.
func TestWatcherReports(t *testing.T) {
	n := newNode(t)
	n.claims = []Claim{{Namespace: "ns", Name: "a", GPU: "g", Share: &Share{Memory: 20 * gib, Compute: 40}}}
	pa := n.run(n.pod("pa", "a"), true, 1, shareEnv(100000, 100)...)
	rec := events.NewFakeRecorder(10)
	w := New(Options{Claims: n, Processes: n, Pods: n, Stop: false, Events: rec, Observer: n, ProcRoot: n.procRoot, Interval: time.Hour})
	w.Check(context.Background())
	w.Check(context.Background())
	if err := unkilled(pa); err != nil {
		t.Fatalf("a reported process was stopped: %v", err)
	}
	got := events_(rec)
	if len(got) != 1 || !strings.Contains(got[0], "GPUShareLimitsRaised") || !strings.Contains(got[0], "100000M") && !strings.Contains(got[0], "97.7 GiB") {
		t.Errorf("events %q", got)
	}

	host := n.run(nil, false, 2)
	node := &corev1.ObjectReference{Kind: "Node", Name: "n1"}
	w = New(Options{Claims: n, Processes: n, Pods: n, Stop: true, Events: rec, Node: node, Observer: n, ProcRoot: n.procRoot, Interval: time.Hour})
	w.Check(context.Background())
	if err := unkilled(host); err != nil {
		t.Fatalf("a process outside Kubernetes was stopped: %v", err)
	}
	got = events_(rec)
	found := false
	for _, e := range got {
		found = found || strings.Contains(e, "GPUProcessOutsideKubernetes") && strings.Contains(e, "never stopped")
	}
	if !found {
		t.Errorf("events %q, want one for the process outside Kubernetes", got)
	}
}

// TestWatcherLeavesWhatItCannotPlace: a PID that went away, and a process
// of a pod the informer does not know yet, are left alone.
func TestWatcherLeavesWhatItCannotPlace(t *testing.T) {
	n := newNode(t)
	n.claims = []Claim{{Namespace: "ns", Name: "a", GPU: "g", Share: &Share{Memory: 1 * gib, Compute: 40}}}
	p := n.pod("pa", "a")
	unknown := n.run(p, true, 30, shareEnv(100000, 100)...)
	delete(n.pods, p.UID)
	gone := n.run(n.pod("pb", "a"), true, 30)
	_ = gone.Process.Kill()
	_ = gone.Wait()
	rec := events.NewFakeRecorder(10)
	w := New(Options{Claims: n, Processes: n, Pods: n, Stop: true, Events: rec, Observer: n, ProcRoot: n.procRoot, Interval: time.Hour})
	w.Check(context.Background())
	if err := unkilled(unknown); err != nil {
		t.Errorf("a process of a pod not known yet was stopped: %v", err)
	}
	if got := events_(rec); len(got) != 0 {
		t.Errorf("events %q", got)
	}
}

// failing lists nothing: an old driver's answer.
type failing struct{ *node }

func (failing) GPUProcesses(string) ([]hw.GPUProcess, error) {
	return nil, fmt.Errorf("GetComputeRunningProcesses: ERROR_NOT_SUPPORTED")
}

// TestWatcherWithoutProcessList: a driver that lists no processes leaves
// the shares unpoliced, said once, and nothing is acted on.
func TestWatcherWithoutProcessList(t *testing.T) {
	n := newNode(t)
	n.claims = []Claim{{Namespace: "ns", Name: "a", GPU: "g", Share: &Share{Memory: gib, Compute: 40}}}
	var logged strings.Builder
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&logged))))
	w := New(Options{Claims: n, Processes: failing{n}, Pods: n, Stop: true, Observer: n, ProcRoot: n.procRoot, Interval: time.Hour})
	for range 3 {
		w.Check(ctx)
	}
	if c := strings.Count(logged.String(), "not policed until the driver lists them"); c != 1 {
		t.Errorf("said %d times, want once:\n%s", c, logged.String())
	}
	if len(n.found) != 0 {
		t.Errorf("acted on %q", n.found)
	}
}
