// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package police

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/tools/events"

	nvmlb "github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
)

// fatEnv is an environment of 6 MB, about the most exec(2) takes (6 MiB
// of strings with a stack limit of 24 MiB or more), in strings of 128 KB
// (the kernel's limit for one is 128 KiB), followed by vars.
func fatEnv(vars ...string) []string {
	var env []string
	for i := range 47 {
		env = append(env, fmt.Sprintf("PAD%02d=%s", i, strings.Repeat("x", 128000-len("PAD00="))))
	}
	return append(env, vars...)
}

// bigStack raises this process's stack limit, which its children
// inherit, so that exec takes 6 MB of environment.
func bigStack(t testing.TB) {
	t.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_STACK, &old); err != nil {
		t.Fatal(err)
	}
	raised := old
	raised.Cur = 64 << 20
	if raised.Max != unix.RLIM_INFINITY && raised.Max < raised.Cur {
		t.Skipf("the stack's hard limit (%d) is too low for 6 MB environments", raised.Max)
	}
	if err := unix.Setrlimit(unix.RLIMIT_STACK, &raised); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_STACK, &old) })
}

// allocated is the heap this process allocated during f.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestTenantFatEnvironments (issue 34, row 3): a share's pods run 40 MPS
// clients with 6 MB environments each (the kernel allows it). The police
// used to read each /proc/<pid>/environ whole and keep every buffer for
// the round: 240 MB and more in one check, over the agent's limit. Now a
// round allocates a bounded heap whatever the environments hold, reads
// at most its cap of them, and every process's environment is read
// within a few rounds; none of these processes, within their share, is
// acted on.
func TestTenantFatEnvironments(t *testing.T) {
	bigStack(t)
	n := newNode(t)
	n.claims = []Claim{{Namespace: "ns", Name: "a", GPU: "g", Share: &Share{Memory: 64 * gib, Compute: 50}}}
	const procs = 40
	env := fatEnv(shareEnv(65536, 50)...)
	for i := range procs {
		n.run(n.pod(fmt.Sprint("p", i), "a"), true, 1, env...)
	}
	rec := events.NewFakeRecorder(procs)
	w := New(Options{Claims: n, Processes: n, Pods: n, Stop: true, Events: rec, Observer: n, ProcRoot: n.procRoot, Interval: time.Hour})
	ctx := context.Background()
	const bound = 1 << 20
	rounds, worst := 0, uint64(0)
	for ; len(w.envs) < procs || rounds < 2; rounds++ {
		if rounds == 20 {
			t.Fatalf("after %d rounds the environments of %d of %d processes were read", rounds, len(w.envs), procs)
		}
		got := allocated(func() { w.Check(ctx) })
		worst = max(worst, got)
		if got > bound {
			t.Fatalf("round %d allocated %d bytes of heap, want at most %d", rounds+1, got, bound)
		}
	}
	t.Logf("%d processes of 6 MB environments: %d rounds to read each once, at most %d KiB of heap allocated in a round", procs, rounds, worst>>10)
	if len(n.found) != 0 {
		t.Errorf("acted on %q, processes within their share", n.found)
	}
	if got := events_(rec); len(got) != 0 {
		t.Errorf("events %q", got)
	}
}

// TestTenantHidesLimitsPastTheCap (row 3, as an attacker): a process
// whose environment runs past what the police reads (8 MiB, more than
// exec allows: made with prctl PR_SET_MM_MAP, which any process may
// call) and whose MPS limits lie beyond is taken at its word: no limits,
// so above its share, and stopped with an Event that says why.
func TestTenantHidesLimitsPastTheCap(t *testing.T) {
	n := newNode(t)
	n.claims = []Claim{{Namespace: "ns", Name: "a", GPU: "g", Share: &Share{Memory: 20 * gib, Compute: 40}}}
	h := startHelper(t, "bigenv", []string{"BIGENV_BYTES=" + fmt.Sprint(8<<20), "BIGENV_TAIL=" + strings.Join(shareEnv(20480, 40), ";")})
	n.place(h.cmd.Process.Pid, n.pod("pa", "a"))
	n.list(h.cmd, true, 1)
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", h.cmd.Process.Pid))
	if err != nil || len(environ) <= envBytesPerProcess || !strings.HasSuffix(string(environ), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40\x00") {
		t.Fatalf("the helper's environment: %d bytes, %v", len(environ), err)
	}
	rec := events.NewFakeRecorder(10)
	w := New(Options{Claims: n, Processes: n, Pods: n, Stop: true, Events: rec, Observer: n, ProcRoot: n.procRoot, Interval: time.Hour})
	w.Check(context.Background())
	if !stopped(h.cmd.Process) {
		t.Fatal("a process that hides its MPS limits past the police's cap was not stopped")
	}
	got := events_(rec)
	if len(got) != 1 || !strings.Contains(got[0], "GPUShareLimitsRaised") || !strings.Contains(got[0], "no CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in the first 6.0 MiB of its environment, which goes on beyond") {
		t.Errorf("events %q", got)
	}
}

// TestTenantRewritesLimitsInPlace (row 4): a client starts with
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100, above its share, then rewrites
// the string in place: /proc/<pid>/environ is its live memory and reads
// 10 afterwards. The police used to accept it from then on (and report
// it anew when it showed 100 again); now what a read found stands for
// the process's life: one report, and still at fault after the rewrite.
// (A process that rewrites its environment before the police first
// reads it, or sets its limits with setenv(3), which /proc does not show,
// is not seen: the README says so.)
func TestTenantRewritesLimitsInPlace(t *testing.T) {
	n := newNode(t)
	n.claims = []Claim{{Namespace: "ns", Name: "a", GPU: "g", Share: &Share{Memory: 20 * gib, Compute: 40}}}
	h := startHelper(t, "rewrite", shareEnv(20480, 100))
	n.place(h.cmd.Process.Pid, n.pod("pa", "a"))
	n.list(h.cmd, true, 1)
	rec := events.NewFakeRecorder(10)
	w := New(Options{Claims: n, Processes: n, Pods: n, Stop: false, Events: rec, Observer: n, ProcRoot: n.procRoot, Interval: time.Hour})
	ctx := context.Background()
	w.Check(ctx)
	if got := events_(rec); len(got) != 1 || !strings.Contains(got[0], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE 100%") {
		t.Fatalf("first round: events %q", got)
	}
	h.say(t, `"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"`+"\t"+`"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10"`)
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", h.cmd.Process.Pid))
	if err != nil || !strings.Contains(string(environ), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10\x00\x00") {
		t.Fatalf("the rewrite did not show in /proc: %q %v", environ, err)
	}
	w.Check(ctx)
	key := toldKey{procKey: procKey{pid: uint32(h.cmd.Process.Pid), start: startOf(t, h.cmd.Process.Pid)}, reason: LimitsRaised}
	if !w.told[key] {
		t.Error("after the rewrite in place the police no longer holds the process at fault")
	}
	h.say(t, `"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10\x00"`+"\t"+`"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"`)
	w.Check(ctx)
	if got := events_(rec); len(got) != 0 {
		t.Errorf("reported again after rewriting its environment back and forth: %q", got)
	}
	if err := unkilled(h.cmd); err != nil {
		t.Errorf("under Report: %v", err)
	}
}

// TestTenantDuplicateLimitsEntry (row 4, the environment read as CUDA
// reads it): a client whose environment names its thread percentage
// twice, 100 first and its share's 40 after. getenv(3), and CUDA with
// it, takes the first; the police used to take the last and accept it.
func TestTenantDuplicateLimitsEntry(t *testing.T) {
	n := newNode(t)
	n.claims = []Claim{{Namespace: "ns", Name: "a", GPU: "g", Share: &Share{Memory: 20 * gib, Compute: 40}}}
	// os/exec would keep one entry of a name (the last): exec directly.
	env := append([]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"}, shareEnv(20480, 40)...)
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	p, err := os.StartProcess(sleep, []string{"sleep", "600"}, &os.ProcAttr{Env: env})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill(); _, _ = p.Wait() })
	n.place(p.Pid, n.pod("pa", "a"))
	n.mu.Lock()
	n.listed = append(n.listed, hw.GPUProcess{PID: uint32(p.Pid), UsedMemory: gb(1), MPS: true})
	n.mu.Unlock()
	w := New(Options{Claims: n, Processes: n, Pods: n, Stop: true, Observer: n, ProcRoot: n.procRoot, Interval: time.Hour})
	w.Check(context.Background())
	if !stopped(p) {
		t.Fatalf("a client whose first CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is 100 (share 40%%) was not stopped; found %q", n.found)
	}
}

// TestWatcherRereadsEnvironment: a client that shows its share's limits
// at the police's first read, then raises them in place (before it
// initialises CUDA, which then reads the raised value), is caught at the
// next round: environments are read again every round (within the cap).
func TestWatcherRereadsEnvironment(t *testing.T) {
	n := newNode(t)
	n.claims = []Claim{{Namespace: "ns", Name: "a", GPU: "g", Share: &Share{Memory: 20 * gib, Compute: 40}}}
	h := startHelper(t, "rewrite", shareEnv(20480, 40))
	n.place(h.cmd.Process.Pid, n.pod("pa", "a"))
	n.list(h.cmd, true, 1)
	w := New(Options{Claims: n, Processes: n, Pods: n, Stop: true, Observer: n, ProcRoot: n.procRoot, Interval: time.Hour})
	w.Check(context.Background())
	if len(n.found) != 0 {
		t.Fatalf("acted on %q within its share", n.found)
	}
	h.say(t, `"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40"`+"\t"+`"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=99"`)
	w.Check(context.Background())
	if !stopped(h.cmd.Process) {
		t.Fatalf("a client that raised its limits in place was not stopped; found %q", n.found)
	}
}

func startOf(t testing.TB, pid int) uint64 {
	t.Helper()
	p, err := inspect("/proc", uint32(pid))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	return p.start
}

// reusing is NVML's process list with a PID reused right after the first
// listing of a round, as a tenant can arrange by cycling PIDs: then the
// process listed is gone and another holds its PID.
type reusing struct {
	Processes
	calls int
	reuse func()
}

func (r *reusing) GPUProcesses(busID string) ([]hw.GPUProcess, error) {
	listed, err := r.Processes.GPUProcesses(busID)
	if r.calls++; r.calls == 1 {
		r.reuse()
	}
	return listed, err
}

// startAt starts a process with PID pid (free now), through the
// kernel's ns_last_pid; other processes of the machine may take it first,
// so it tries again.
func startAt(t testing.TB, pid int) *exec.Cmd {
	t.Helper()
	for range 1000 {
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(fmt.Sprint(pid-1)), 0o644); err != nil {
			t.Skipf("setting the next PID: %v (needs root)", err)
		}
		cmd := exec.Command("sleep", "600")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if cmd.Process.Pid == pid {
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			return cmd
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	t.Fatalf("could not start a process with PID %d", pid)
	return nil
}

// reuseFor ends cmd's process and starts another, of pod victim, under
// its PID, in a later clock tick than the one it started in (the mock,
// like the driver, then no longer lists the PID).
func reuseFor(t testing.TB, n *node, cmd *exec.Cmd, victim string) *exec.Cmd {
	t.Helper()
	pid := cmd.Process.Pid
	start := startOf(t, pid)
	for bootTicks() <= start {
		runtime.Gosched()
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	v := startAt(t, pid)
	n.place(pid, n.pod(victim, ""))
	return v
}

// TestTenantPIDReusedBetweenListingAndPidfd (row 9): NVML lists a
// tenant's process holding 30 GiB; before the police opens its pidfd the
// process is gone and another pod's process, which uses no GPU, holds its
// PID. The police used to judge that process against the dead one's
// entry (a pod's process on the GPU without its claim) and SIGKILL it.
// Now it lists the GPU's processes again once the pidfds are open, and
// leaves a process the second listing does not name. The GPU is the
// mock's, whose list drops a process once its PID is gone or another's.
func TestTenantPIDReusedBetweenListingAndPidfd(t *testing.T) {
	const gpu = "0000:1b:00.0"
	h := mocktest.Open(t, "gpus: [{model: h100-80gb, count: 1}]")
	b := nvmlb.New(h.NVML, nvmlb.WithSysfs(h.Sysfs))
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Shutdown() })
	n := newNode(t)
	n.claims = []Claim{{Namespace: "ns", Name: "a", GPU: gpu, Share: &Share{Memory: 10 * gib, Compute: 40}}}
	tenant := exec.Command("sleep", "600")
	n.start(tenant, n.pod("tenant", "a"))
	if err := h.SetGPUProcesses(gpu, []hw.GPUProcess{{PID: uint32(tenant.Process.Pid), UsedMemory: gb(30), MPS: true}}); err != nil {
		t.Fatal(err)
	}
	var victim *exec.Cmd
	procs := &reusing{Processes: b, reuse: func() { victim = reuseFor(t, n, tenant, "victim") }}
	w := New(Options{Claims: n, Processes: procs, Pods: n, Stop: true, Observer: n, ProcRoot: n.procRoot, Interval: time.Hour})
	w.Check(context.Background())
	if victim == nil {
		t.Fatal("the PID was not reused")
	}
	if err := unkilled(victim); err != nil {
		t.Fatalf("the process that took the listed PID over: %v; found %q", err, n.found)
	}
	if len(n.found) != 0 {
		t.Errorf("acted on %q", n.found)
	}
}

// stale lists one entry whatever runs: a driver that still lists a
// process that has exited (its context not torn down yet).
type stale struct {
	entry hw.GPUProcess
	calls int
	reuse func()
}

func (s *stale) GPUProcesses(string) ([]hw.GPUProcess, error) {
	if s.calls++; s.calls == 1 {
		s.reuse()
	}
	return []hw.GPUProcess{s.entry}, nil
}

// TestTenantPIDReusedUnderAStaleListing (row 9): as above, but the driver
// lists the dead process in both listings. The process holding its PID
// started after the first listing: it is not the process listed, and is
// left alone.
func TestTenantPIDReusedUnderAStaleListing(t *testing.T) {
	n := newNode(t)
	n.claims = []Claim{{Namespace: "ns", Name: "a", GPU: "g", Share: &Share{Memory: 10 * gib, Compute: 40}}}
	tenant := exec.Command("sleep", "600")
	n.start(tenant, n.pod("tenant", "a"))
	var victim *exec.Cmd
	procs := &stale{entry: hw.GPUProcess{PID: uint32(tenant.Process.Pid), UsedMemory: gb(30), MPS: true}}
	procs.reuse = func() {
		// The listing was taken in this clock tick or an earlier one.
		listed := bootTicks()
		for bootTicks() <= listed {
			runtime.Gosched()
		}
		victim = reuseFor(t, n, tenant, "victim")
	}
	w := New(Options{Claims: n, Processes: procs, Pods: n, Stop: true, Observer: n, ProcRoot: n.procRoot, Interval: time.Hour})
	w.Check(context.Background())
	if err := unkilled(victim); err != nil {
		t.Fatalf("the process that took the listed PID over: %v; found %q", err, n.found)
	}
	if len(n.found) != 0 {
		t.Errorf("acted on %q", n.found)
	}
}

// snapshot answers the first listing with what the driver listed before
// the PID was reused (the listing's content is older than its answer),
// later ones from the driver.
type snapshot struct {
	Processes
	first []hw.GPUProcess
	calls int
}

func (s *snapshot) GPUProcesses(busID string) ([]hw.GPUProcess, error) {
	if s.calls++; s.calls == 1 {
		return s.first, nil
	}
	return s.Processes.GPUProcesses(busID)
}

// TestTenantPIDReusedBeforeTheListingReturned (row 9): the first listing
// names the tenant's process, which had already gone and whose PID
// another pod's process took before the listing returned (so that
// process started before the round began: its start time does not give
// it away). The second listing, from the mock GPU, no longer names the
// PID: the process holding it is left alone.
func TestTenantPIDReusedBeforeTheListingReturned(t *testing.T) {
	const gpu = "0000:1b:00.0"
	h := mocktest.Open(t, "gpus: [{model: h100-80gb, count: 1}]")
	b := nvmlb.New(h.NVML, nvmlb.WithSysfs(h.Sysfs))
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Shutdown() })
	n := newNode(t)
	n.claims = []Claim{{Namespace: "ns", Name: "a", GPU: gpu, Share: &Share{Memory: 10 * gib, Compute: 40}}}
	tenant := exec.Command("sleep", "600")
	n.start(tenant, n.pod("tenant", "a"))
	if err := h.SetGPUProcesses(gpu, []hw.GPUProcess{{PID: uint32(tenant.Process.Pid), UsedMemory: gb(30), MPS: true}}); err != nil {
		t.Fatal(err)
	}
	first, err := b.GPUProcesses(gpu)
	if err != nil || len(first) != 1 {
		t.Fatalf("the mock lists %+v, %v", first, err)
	}
	victim := reuseFor(t, n, tenant, "victim")
	// The round begins in a later clock tick than the victim started in.
	for started := startOf(t, victim.Process.Pid); bootTicks() <= started; {
		runtime.Gosched()
	}
	w := New(Options{Claims: n, Processes: &snapshot{Processes: b, first: first}, Pods: n, Stop: true, Observer: n, ProcRoot: n.procRoot, Interval: time.Hour})
	w.Check(context.Background())
	if err := unkilled(victim); err != nil {
		t.Fatalf("the process that took the listed PID over: %v; found %q", err, n.found)
	}
	if len(n.found) != 0 {
		t.Errorf("acted on %q", n.found)
	}
}
