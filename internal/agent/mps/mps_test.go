// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package mps

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2/ktesting"

	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/drivertools"
	"github.com/hwdra/hwdra/internal/procstat"
)

func ptr[T any](v T) *T { return &v }

func TestSpec(t *testing.T) {
	s := Spec{ID: ID("share", []string{"GPU-a", "GPU-b"}), Devices: []string{"GPU-a", "GPU-b"},
		ActiveThreadPercentage: ptr(30), PinnedMemoryLimit: ptr(uint64(5<<30 + 123))}
	if s.ID != ID("share", []string{"GPU-a", "GPU-b"}) || s.ID == ID("uid-1", []string{"GPU-a", "GPU-b"}) || len(s.ID) != 12 {
		t.Errorf("ID %q: not stable or not owner-specific", s.ID)
	}
	want := []string{"set_default_active_thread_percentage 30", "set_default_device_pinned_mem_limit 0 5120M", "set_default_device_pinned_mem_limit 1 5120M"}
	if got := s.Commands(); !slices.Equal(got, want) {
		t.Errorf("commands %q, want %q", got, want)
	}
	if got := (Spec{Devices: []string{"GPU-a"}}).Commands(); len(got) != 0 {
		t.Errorf("commands without defaults: %q", got)
	}
	d := DirsOf("/var/lib/hwdra/mps", s.ID)
	e := s.ClientEdits(d, Limits{ActiveThreadPercentage: ptr(40), PinnedMemoryLimit: ptr(uint64(512 << 20))})
	wantEnv := []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=512M,1=512M"}
	if !slices.Equal(e.Env, wantEnv) {
		t.Errorf("env %q, want %q", e.Env, wantEnv)
	}
	if len(e.Mounts) != 2 || e.Mounts[0].HostPath != d.Pipe || e.Mounts[0].ContainerPath != ContainerPipeDir ||
		e.Mounts[1].HostPath != d.Shm || e.Mounts[1].ContainerPath != "/dev/shm" {
		t.Errorf("mounts %+v", e.Mounts)
	}
	if e := s.ClientEdits(d, Limits{}); len(e.Env) != 1 {
		t.Errorf("env without limits: %q", e.Env)
	}
	if got := megabytes(100); got != "1M" {
		t.Errorf("a limit below a megabyte is %s, want the smallest, 1M", got)
	}
}

// newManager is a Manager on a driver's bin folder with the mock's programs.
func newManager(t *testing.T, stateDir string) *Manager {
	t.Helper()
	bin := filepath.Join(stateDir, "driver-root", "usr", "bin")
	if err := drivertools.Install(bin, false); err != nil {
		t.Fatal(err)
	}
	m, err := Open(Options{Dir: filepath.Join(stateDir, "mps"), StateFile: filepath.Join(stateDir, "mps.json"),
		Programs: nvml.Programs{Bin: bin}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func testSpec() Spec {
	devices := []string{"GPU-1b", "GPU-43"}
	return Spec{ID: ID("uid-1", devices), Devices: devices,
		Serves:                 []hw.PartitionRef{{GPU: "0000:1b:00.0"}, {GPU: "0000:43:00.0"}},
		ActiveThreadPercentage: ptr(25), PinnedMemoryLimit: ptr(uint64(2 << 30))}
}

// commands are what the daemon of id was told, by process, in order.
func commands(t *testing.T, m *Manager, id string) map[int][]string {
	t.Helper()
	events, err := drivertools.MPSLog(m.Dirs(id).Log)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int][]string{}
	for _, e := range events {
		switch {
		case e.Event == "start":
			out[e.PID] = append(out[e.PID], "start "+e.VisibleDevices)
		case e.Event == "command" && !e.Failed && e.Command != "get_server_list": // liveness checks
			out[e.PID] = append(out[e.PID], e.Command)
		}
	}
	return out
}

// started is a manager with the test spec's daemon running (stopped at
// the test's end) and the daemon's PID.
func started(t *testing.T, ctx context.Context) (*Manager, Spec, int) {
	t.Helper()
	m := newManager(t, t.TempDir())
	s := testSpec()
	if err := m.Start(ctx, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(context.Background(), s.ID) })
	return m, s, pidOf(t, m, s.ID)
}

func pidOf(t *testing.T, m *Manager, id string) int {
	r, ok := m.state.Get(id)
	if !ok {
		t.Fatalf("daemon %s not recorded", id)
	}
	return r.PID
}

// A daemon starts with its devices and defaults, is left alone by a
// second Start, and Stop leaves nothing: no process, no directories, no
// record.
func TestStartStop(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, s, pid := started(t, ctx)
	if err := m.Check(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx, s); err != nil || pidOf(t, m, s.ID) != pid {
		t.Fatalf("second start: %v, pid %d, was %d", err, pidOf(t, m, s.ID), pid)
	}
	want := []string{"start GPU-1b,GPU-43", "set_default_active_thread_percentage 25",
		"set_default_device_pinned_mem_limit 0 2048M", "set_default_device_pinned_mem_limit 1 2048M",
		"get_default_active_thread_percentage"}
	got := commands(t, m, s.ID)
	if len(got) != 1 || !slices.Equal(got[pid], want) {
		t.Errorf("daemon told %v, want %q", got, want)
	}
	if os.Geteuid() == 0 {
		// Its /dev/shm is its shared-memory directory (the mock keeps a
		// file there), which its clients mount.
		if _, err := os.Stat(filepath.Join(m.Dirs(s.ID).Shm, drivertools.ShmMarkerPrefix+itoa(pid))); err != nil {
			t.Errorf("the daemon's /dev/shm is not its directory: %v", err)
		}
	}
	if err := m.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if syscall.Kill(pid, 0) == nil {
		if _, err := procstat.StartTime(pid); err == nil {
			t.Errorf("process %d runs after Stop", pid)
		}
	}
	if _, err := os.Stat(filepath.Join(m.opts.Dir, s.ID)); !os.IsNotExist(err) {
		t.Errorf("directory after Stop: %v", err)
	}
	if ids := m.IDs(); len(ids) != 0 {
		t.Errorf("recorded after Stop: %v", ids)
	}
	if err := m.Stop(ctx, s.ID); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// An agent started after another adopts its daemons: the same process,
// not started again.
func TestAdopt(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	first := newManager(t, dir)
	s := testSpec()
	if err := first.Start(ctx, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Stop(context.Background(), s.ID) })
	pid := pidOf(t, first, s.ID)
	second := newManager(t, dir)
	if err := second.Check(ctx, s.ID); err != nil {
		t.Fatalf("the next agent's check: %v", err)
	}
	if down := second.Supervise(ctx); len(down) != 0 {
		t.Errorf("supervise found down: %v", down)
	}
	if err := second.Start(ctx, s); err != nil || pidOf(t, second, s.ID) != pid {
		t.Errorf("start after adoption: %v, pid %d, was %d", err, pidOf(t, second, s.ID), pid)
	}
	if got := commands(t, second, s.ID); len(got) != 1 {
		t.Errorf("daemon started again: %v", got)
	}
}

// A daemon that died is found down and started again, with its defaults.
func TestSuperviseRestarts(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, s, pid := started(t, ctx)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for startTimeOK(pid) {
	}
	if err := m.Check(ctx, s.ID); err == nil {
		t.Fatal("a killed daemon checks alive")
	}
	down := m.Supervise(ctx)
	if _, ok := down[s.ID]; !ok || len(down) != 1 {
		t.Fatalf("supervise found down %v", down)
	}
	again := pidOf(t, m, s.ID)
	if again == pid || m.Check(ctx, s.ID) != nil {
		t.Fatalf("not started again: pid %d (was %d), check %v, supervise %v", again, pid, m.Check(ctx, s.ID), down)
	}
	if got := commands(t, m, s.ID)[again]; !slices.Contains(got, "set_default_active_thread_percentage 25") {
		t.Errorf("the new daemon lacks its defaults: %q", got)
	}
	if down := m.Supervise(ctx); len(down) != 0 {
		t.Errorf("down after the restart: %v", down)
	}
}

func startTimeOK(pid int) bool { _, err := procstat.StartTime(pid); return err == nil }

// A daemon that refuses its defaults fails Start; it stays recorded and
// Stop leaves nothing running. A missing program fails with its path.
func TestStartFails(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m := newManager(t, t.TempDir())
	s := testSpec()
	s.ActiveThreadPercentage = ptr(0)
	err := m.Start(ctx, s)
	if err == nil || !strings.Contains(err.Error(), "set_default_active_thread_percentage 0") {
		t.Fatalf("start: %v", err)
	}
	pid := pidOf(t, m, s.ID)
	if err := m.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if startTimeOK(pid) {
		t.Errorf("process %d runs after a failed start and Stop", pid)
	}
	m.opts.Programs.Bin = filepath.Join(t.TempDir(), "nothing")
	if err := m.Start(ctx, testSpec()); err == nil || !strings.Contains(err.Error(), Control) {
		t.Errorf("start without the program: %v", err)
	}
	if err := m.Stop(ctx, testSpec().ID); err != nil {
		t.Error(err)
	}
}

// A Start cancelled while its daemon is being launched (hwdra lab
// interrupted) still learns the daemon's PID: the daemon runs in a session
// of its own, and only a recorded PID lets Stop end it.
func TestStartCancelledDuringLaunch(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	m := newManager(t, t.TempDir())
	s := testSpec()
	// The directories are made right before the launch.
	go func() {
		for {
			if _, err := os.Stat(m.Dirs(s.ID).Log); err == nil {
				cancel()
				return
			}
			// Polled at 1 ms, not through waitfor: the cancel must land
			// inside the launch's short window, from this goroutine.
			time.Sleep(time.Millisecond)
		}
	}()
	err := m.Start(ctx, s)
	t.Logf("start: %v", err)
	pid := pidOf(t, m, s.ID)
	if pid == 0 || !startTimeOK(pid) {
		t.Errorf("the daemon is recorded with PID %d, not the running one's", pid)
	}
	if err := m.Stop(context.Background(), s.ID); err != nil {
		t.Fatal(err)
	}
	if pid != 0 && startTimeOK(pid) {
		t.Errorf("process %d runs after Stop", pid)
	}
	// Before a launch, a cancelled context starts nothing.
	if err := m.Start(ctx, s); !errors.Is(err, context.Canceled) {
		t.Errorf("start on a cancelled context: %v", err)
	}
	if ids := m.IDs(); len(ids) != 0 {
		t.Errorf("recorded: %v", ids)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// A launcher that fails (here: a directory to cover is a file) fails
// Start with its reason; nothing of the daemon runs, and Stop leaves no
// mount or directory.
func TestLaunchFails(t *testing.T) {
	needRoot(t)
	_, ctx := ktesting.NewTestContext(t)
	m := newManager(t, t.TempDir())
	file := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	m.opts.Mask = []string{file}
	s := testSpec()
	err := m.Start(ctx, s)
	if err == nil || !strings.Contains(err.Error(), "cover "+file+": not a directory") {
		t.Fatalf("start: %v", err)
	}
	if pid := pidOf(t, m, s.ID); pid != 0 {
		// Killed, and reaped by the agent.
		if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			return !startTimeOK(pid), nil
		}); err != nil {
			t.Errorf("the launcher %d runs: %v", pid, err)
		}
	}
	if err := m.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if n := shmMounts(t, m.Dirs(s.ID).Shm); n != 0 {
		t.Errorf("%d mounts left", n)
	}
	if _, err := os.Stat(filepath.Join(m.opts.Dir, s.ID)); !os.IsNotExist(err) {
		t.Errorf("directory after Stop: %v", err)
	}
}

// TestTenantReusedPIDIsNotSignalled: a recorded daemon whose PID now
// names another process (a tenant's, started after the daemon ended) is
// taken as gone: Stop removes the record and signals nothing (lab undo
// runs this after the daemon's hardware is gone).
func TestTenantReusedPIDIsNotSignalled(t *testing.T) {
	dir := t.TempDir()
	m, err := Open(Options{Dir: filepath.Join(dir, "mps"), StateFile: filepath.Join(dir, "mps.json")})
	if err != nil {
		t.Fatal(err)
	}
	tenant := exec.Command("sleep", "600")
	if err := tenant.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- tenant.Wait() }()
	t.Cleanup(func() { _ = tenant.Process.Kill() })
	st, err := procstat.StartTime(tenant.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// The daemon ran under this PID before: another start time.
	if err := m.state.Put("d", record{Spec: Spec{ID: "d"}, PID: tenant.Process.Pid, StartTime: st - 1}); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(context.Background(), "d"); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Spec("d"); ok {
		t.Error("the record stays")
	}
	select {
	case err := <-exited:
		t.Fatalf("the tenant's process was signalled: %v", err)
	default:
	}
	if got, err := procstat.StartTime(tenant.Process.Pid); err != nil || got != st {
		t.Fatalf("the tenant's process is gone: %v", err)
	}
}
