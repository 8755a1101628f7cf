// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package mps

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2/ktesting"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/mock/drivertools"
)

// bystander is a process of the node that is not the agent's (a
// kubelet): a sleep, and a channel closed when it ends.
func bystander(t *testing.T) (int, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { _ = cmd.Wait(); close(ended) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-ended })
	return cmd.Process.Pid, ended
}

// plantPID is a tenant with the pipe directory mounted: until the
// returned func is called (the tenant's container gone) it keeps the
// daemon's PID file saying pid, rewriting it the moment anything else is
// there.
func plantPID(t *testing.T, pipe string, pid int) func() {
	t.Helper()
	file, want := filepath.Join(pipe, drivertools.PIDFile), []byte(strconv.Itoa(pid)+"\n")
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, want) {
				_ = os.WriteFile(file, want, 0o644)
			}
			select {
			case <-done:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	}()
	var once sync.Once
	stop := func() { once.Do(func() { close(done); <-stopped }) }
	t.Cleanup(stop)
	return stop
}

// TestTenantPlantedPIDFile (issue 34, row 1): a tenant writes a node
// process's PID into the daemon's PID file in the pipe directory it has
// mounted, and deletes the control pipe, twice. The agent starts the
// daemon again each time, never takes the planted PID for the daemon's,
// and never signals the node process: only the daemon it launched is
// ended, and the daemon recovers.
func TestTenantPlantedPIDFile(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, s, first := started(t, ctx)
	victim, killed := bystander(t)
	pipe := m.Dirs(s.ID).Pipe
	tenantGone := plantPID(t, pipe, victim)
	daemons := []int{first}
	for round := 1; round <= 2; round++ {
		if err := os.Remove(filepath.Join(pipe, "control")); err != nil {
			t.Fatalf("round %d: the tenant deletes control: %v", round, err)
		}
		down := m.Supervise(ctx)
		if _, ok := down[s.ID]; !ok {
			t.Fatalf("round %d: the daemon without its control pipe is not found down: %v", round, down)
		}
		pid := pidOf(t, m, s.ID)
		if pid == victim {
			t.Errorf("round %d: the agent took the planted PID %d for its daemon's", round, victim)
		}
		if err := m.Check(ctx, s.ID); err != nil {
			t.Errorf("round %d: the daemon did not recover: %v (supervise: %v)", round, err, down[s.ID])
		}
		if slices.Contains(daemons, pid) || !startTimeOK(pid) {
			t.Errorf("round %d: daemon %d, earlier %v: not a new running one", round, pid, daemons)
		}
		for _, old := range daemons {
			if startTimeOK(old) {
				t.Errorf("round %d: the daemon %d it replaced still runs", round, old)
			}
		}
		daemons = append(daemons, pid)
		select {
		case <-killed:
			t.Fatalf("round %d: the node process %d whose PID the tenant planted was killed", round, victim)
		default:
		}
	}
	tenantGone() // its claim is unprepared once its containers are gone
	if err := m.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-killed:
		t.Fatalf("Stop killed the node process %d whose PID the tenant planted", victim)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestTenantControlPipeTakenOver: a tenant deletes the daemon's control
// pipe and listens there itself, answering every command as the daemon
// would (with the driver's programs in its container it could run a
// daemon of its own there, which the other tenants' new clients would
// reach). The agent does not take it for its daemon: the daemon is found
// down and started again, and its control pipe is its own again.
func TestTenantControlPipeTakenOver(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, s, first := started(t, ctx)
	pipe := m.Dirs(s.ID).Pipe
	if err := os.Remove(filepath.Join(pipe, "control")); err != nil {
		t.Fatal(err)
	}
	dir, err := os.Open(pipe)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/control", dir.Fd()))
	dir.Close()
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = bufio.NewReader(c).ReadString('\n')
			_, _ = c.Write([]byte("OK\n\n"))
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-served })
	down := m.Supervise(ctx)
	if _, ok := down[s.ID]; !ok {
		t.Fatalf("the daemon whose control pipe a tenant answers is not found down: %v", down)
	}
	pid := pidOf(t, m, s.ID)
	if pid == first || !startTimeOK(pid) || startTimeOK(first) {
		t.Errorf("daemon %d (was %d): not started again", pid, first)
	}
	if peer, err := controlPeer(pipe); err != nil || peer != pid {
		t.Errorf("the control pipe is process %d's (%v), not the daemon %d's", peer, err, pid)
	}
	if err := m.Check(ctx, s.ID); err != nil {
		t.Errorf("after the restart: %v", err)
	}
}

// A record whose PID is another process's now (its start time, program,
// environment or cgroup differ) names no daemon: no signal reaches it.
func TestKillLeavesOthersAlone(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, s, _ := started(t, ctx)
	victim, killed := bystander(t)
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", victim))
	if err != nil {
		t.Fatal(err)
	}
	_, start := parseStart(t, st)
	r, _ := m.state.Get(s.ID)
	forged := r
	forged.PID, forged.StartTime = victim, start // even the right start time
	if _, err := m.open(forged); !errors.Is(err, errNotOurs) {
		t.Errorf("a sleep passes for the daemon: %v", err)
	}
	forged.Exe = nil // a record of an earlier agent: checked against the control program
	if _, err := m.open(forged); !errors.Is(err, errNotOurs) {
		t.Errorf("a sleep passes for an earlier agent's daemon: %v", err)
	}
	if err := m.kill(ctx, forged, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-killed:
		t.Fatal("the sleep was killed")
	case <-time.After(100 * time.Millisecond):
	}
	// The daemon itself, adopted from a record without Exe (an earlier
	// agent's), is found.
	r.Exe = nil
	p, err := m.open(r)
	if err != nil {
		t.Fatalf("the daemon from an earlier agent's record: %v", err)
	}
	p.close()
}

func parseStart(t *testing.T, stat []byte) (byte, uint64) {
	t.Helper()
	i := bytes.LastIndexByte(stat, ')')
	f := strings.Fields(string(stat[i+1:]))
	v, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return f[0][0], v
}

// needRoot skips a test that mounts or makes cgroups.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts and cgroups")
	}
}

// TestTenantSharedMemoryBounded (issue 34, row 5): a tenant writes into
// /dev/shm of its MPS container. It is the daemon's own tmpfs, not the
// node's disk: size-limited (a write past it fails with ENOSPC, nothing
// reaches /var/lib), mounted nosuid,nodev,noexec, and given to clients
// noexec too. Stop unmounts it; a failed start leaves none behind.
func TestTenantSharedMemoryBounded(t *testing.T) {
	needRoot(t)
	_, ctx := ktesting.NewTestContext(t)
	const size = 8 << 20
	m := newManager(t, t.TempDir())
	m.opts.ShmSize = size
	s := testSpec()
	if err := m.Start(ctx, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(context.Background(), s.ID) })
	shm := m.Dirs(s.ID).Shm
	mi := shmMount(t, shm)
	if mi == nil {
		t.Fatalf("%s is no tmpfs: the tenant writes onto the node's disk", shm)
	}
	for _, o := range []string{"nosuid", "nodev", "noexec"} {
		if !slices.Contains(strings.Split(mi.Options, ","), o) {
			t.Errorf("the shared memory is mounted %s, without %s", mi.Options, o)
		}
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(shm, &fs); err != nil || int64(fs.Blocks)*fs.Bsize != size {
		t.Errorf("the shared memory holds %d bytes (%v), want %d", int64(fs.Blocks)*fs.Bsize, err, size)
	}
	// The tenant fills it.
	err := os.WriteFile(filepath.Join(shm, "fill"), make([]byte, size+1<<20), 0o600)
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("writing past the size: %v, want ENOSPC", err)
	}
	e := s.ClientEdits(m.Dirs(s.ID), Limits{})
	if i := slices.IndexFunc(e.Mounts, func(mt *cdispec.Mount) bool { return mt.ContainerPath == "/dev/shm" }); i < 0 || !slices.Contains(e.Mounts[i].Options, "noexec") {
		t.Errorf("the clients' /dev/shm is not mounted noexec: %+v", e.Mounts)
	}
	// A second Start (an adopting agent's) does not mount it twice.
	if err := m.Start(ctx, s); err != nil {
		t.Fatal(err)
	}
	if n := shmMounts(t, shm); n != 1 {
		t.Errorf("%d mounts on the shared memory after a second start, want 1", n)
	}
	if err := m.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if n := shmMounts(t, shm); n != 0 {
		t.Errorf("the shared memory is still mounted after Stop (%d)", n)
	}
	// A start that fails (the daemon refuses its defaults) and its Stop
	// (the prepare's undo) leave no mount, no cgroup, no directory.
	s.ActiveThreadPercentage = ptr(0)
	if err := m.Start(ctx, s); err == nil {
		t.Fatal("a start with a refused default succeeded")
	}
	if err := m.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(m.opts.Dir, s.ID)); !os.IsNotExist(err) || shmMounts(t, shm) != 0 {
		t.Errorf("after a failed start and Stop: directory %v, %d mounts", err, shmMounts(t, shm))
	}
}

// shmMount is the mount on dir, nil for none.
func shmMount(t *testing.T, dir string) *mountinfo.Info {
	t.Helper()
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil
	}
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(real))
	if err != nil {
		t.Fatal(err)
	}
	for _, mi := range mounts {
		if mi.FSType == "tmpfs" {
			return mi
		}
	}
	return nil
}

func shmMounts(t *testing.T, dir string) int {
	t.Helper()
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return 0
	}
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(real))
	if err != nil {
		t.Fatal(err)
	}
	return len(mounts)
}

// testCgroup is a cgroup path for a test's daemons, below this process's
// memory cgroup (cgroup v1's memory hierarchy: a v2 cgroup with
// processes hands no controller down), removed at the end.
func testCgroup(t *testing.T) (Cgroup, string) {
	t.Helper()
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(own), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), "memory") {
			path := filepath.Join(parts[2], fmt.Sprintf("hwdra-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
			dir := filepath.Join("/sys/fs/cgroup/memory", path)
			if _, err := os.Stat(filepath.Dir(dir)); err != nil {
				t.Skipf("this process's memory cgroup is not at %s: %v", filepath.Dir(dir), err)
			}
			t.Cleanup(func() { _ = unix.Rmdir(dir) })
			return Cgroup(path), dir
		}
	}
	t.Skip("no cgroup v1 memory hierarchy here")
	return "", ""
}

// TestTenantDaemonHoldsNoAgentPrivileges: the daemon, the one process
// of the agent that every tenant on it talks to, holds none of what the
// agent holds: its environment is a few variables (none of the agent's:
// no service account, no API server), the agent's token is covered in
// its mount namespace and no other daemon's shared memory is there, it
// keeps DaemonCapabilities alone with no_new_privs, and its cgroup's
// memory is limited. Stop ends what is left in that cgroup (an MPS
// server) and removes it.
func TestTenantDaemonHoldsNoAgentPrivileges(t *testing.T) {
	needRoot(t)
	_, ctx := ktesting.NewTestContext(t)
	t.Setenv("HWDRA_TEST_AGENT_SECRET", "the agent's")
	cg, cgDir := testCgroup(t)
	secrets := filepath.Join(t.TempDir(), "secrets")
	token := filepath.Join(secrets, "kubernetes.io", "serviceaccount", "token")
	if err := os.MkdirAll(filepath.Dir(token), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(token, []byte("token"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := newManager(t, t.TempDir())
	m.opts.Cgroup, m.opts.Mask, m.opts.MemoryLimit = cg, []string{secrets}, 256<<20
	// Another daemon first: its shared memory must not be in the next
	// one's mounts.
	other := testSpec()
	other.ID, other.Devices = ID("uid-2", []string{"GPU-99"}), []string{"GPU-99"}
	s := testSpec()
	for _, sp := range []Spec{other, s} {
		if err := m.Start(ctx, sp); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := m.Stop(context.Background(), sp.ID); err != nil {
				t.Errorf("stopping %s: %v", sp.ID, err)
			}
		})
	}
	pid := pidOf(t, m, s.ID)
	checkDaemonHolds(t, pid, token, m.Dirs(other.ID).Shm)
	dir := filepath.Join(filepath.Dir(cgDir), filepath.Base(cgDir), cgroupName(s.ID))
	if limit, err := os.ReadFile(filepath.Join(dir, "memory.limit_in_bytes")); err != nil || strings.TrimSpace(string(limit)) != strconv.Itoa(256<<20) {
		t.Errorf("the daemon's cgroup memory limit: %q %v, want %d", limit, err, 256<<20)
	}
	if !inCgroup(pid, cgroupName(s.ID)) {
		t.Errorf("the daemon is not in its cgroup %s", cgroupName(s.ID))
	}
	// An MPS server left in the cgroup when its daemon goes.
	server := exec.Command("sleep", "600")
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	serverEnded := make(chan struct{})
	go func() { _ = server.Wait(); close(serverEnded) }()
	t.Cleanup(func() { _ = server.Process.Kill() })
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(server.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-serverEnded:
	case <-time.After(10 * time.Second):
		t.Error("the process left in the daemon's cgroup runs after Stop")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the daemon's cgroup %s after Stop: %v", dir, err)
	}
}

// checkDaemonHolds checks what daemon pid holds: an environment of the
// daemon's variables alone, no token (at its path in the agent's mounts),
// no other daemon's shared memory (otherShm), DaemonCapabilities alone and
// no_new_privs.
func checkDaemonHolds(t *testing.T, pid int, token, otherShm string) {
	t.Helper()
	proc := func(f string) string {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	var names []string
	for _, kv := range strings.Split(strings.TrimRight(proc("environ"), "\x00"), "\x00") {
		names = append(names, strings.SplitN(kv, "=", 2)[0])
	}
	slices.Sort(names)
	if want := []string{"CUDA_MPS_LOG_DIRECTORY", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_VISIBLE_DEVICES", "PATH"}; !slices.Equal(names, want) {
		t.Errorf("the daemon's environment has %q, want only %q", names, want)
	}
	if _, err := os.ReadFile(fmt.Sprintf("/proc/%d/root%s", pid, token)); err == nil {
		t.Errorf("the daemon reads the agent's token %s", token)
	}
	if strings.Contains(proc("mountinfo"), otherShm) {
		t.Errorf("the daemon's mounts hold another daemon's shared memory %s", otherShm)
	}
	status := proc("status")
	var want uint64
	for _, c := range DaemonCapabilities {
		want |= 1 << uint(c)
	}
	for _, f := range []string{"CapEff", "CapPrm", "CapBnd"} {
		if got := statusField(t, status, f); got != fmt.Sprintf("%016x", want) {
			t.Errorf("the daemon's %s is %s, want %016x (%v)", f, got, want, DaemonCapabilities)
		}
	}
	if got := statusField(t, status, "CapInh"); got != "0000000000000000" {
		t.Errorf("the daemon's CapInh is %s", got)
	}
	if got := statusField(t, status, "NoNewPrivs"); got != "1" {
		t.Errorf("the daemon's NoNewPrivs is %s", got)
	}
}

// statusField is a field of /proc/<pid>/status.
func statusField(t *testing.T, status, name string) string {
	t.Helper()
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in status", name)
	return ""
}
