// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package mps

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/keyedlock"
	"github.com/hwdra/hwdra/internal/procstat"
	"github.com/hwdra/hwdra/internal/state"
)

// Control is the MPS control program's name in the driver.
const Control = "nvidia-cuda-mps-control"

// Defaults of Options.
const (
	// DefaultShmSize is a daemon's shared memory (its clients' /dev/shm):
	// MPS keeps little there, but its clients share it for their own
	// POSIX shared memory too (PyTorch's data loaders, NCCL).
	DefaultShmSize = 1 << 30
	// DefaultMemoryLimit bounds a daemon's cgroup: the control daemon and
	// its MPS servers, each of which holds the host side of its clients'
	// contexts.
	DefaultMemoryLimit = 4 << 30
)

// DefaultMask are the directories daemons do not see: where Kubernetes
// mounts the agent's service account token.
var DefaultMask = []string{"/var/run/secrets", "/run/secrets"}

// Options configure a Manager.
type Options struct {
	// Dir holds the daemons' directories (<state>/mps) and StateFile
	// records them.
	Dir, StateFile string
	// Programs are the driver's programs: Control comes from there.
	Programs nvml.Programs
	// Cgroup is where daemons' processes go.
	Cgroup Cgroup
	// ShmSize is the size of each daemon's shared memory, MemoryLimit
	// the memory limit of its cgroup, in bytes (0: the defaults).
	ShmSize, MemoryLimit int64
	// Mask are directories hidden from the daemons (nil: DefaultMask).
	Mask []string
	// Timeout bounds each call of the control program (default 10s).
	Timeout time.Duration
}

// Manager starts, adopts, watches and stops control daemons. Each
// daemon is recorded (StateFile) before anything of it is made, so one
// that an agent started is found again by the next.
type Manager struct {
	opts  Options
	state *state.Ledger[record]
	locks keyedlock.Locks
}

// record is a daemon as the state file keeps it.
type record struct {
	Spec Spec `json:"spec"`
	// PID and StartTime (clock ticks after boot, /proc/<pid>/stat) name
	// the daemon's process once it runs: the PID its launch returned (a
	// record of an earlier agent: the one its PID file said), and with
	// it the start time, which a PID reused by another process does not
	// share.
	PID       int    `json:"pid,omitempty"`
	StartTime uint64 `json:"startTime,omitempty"`
	// Exe is the executable the process runs: the driver's control
	// program when it was launched.
	Exe *fileID `json:"exe,omitempty"`
	// Cgroup is the name of the daemon's own cgroup; empty where it
	// runs in the agent's.
	Cgroup string `json:"cgroup,omitempty"`
	// ShmTmpfs: its shared memory is a tmpfs of its own (not for an
	// agent without root, nor a daemon of an earlier agent, whose
	// clients have a directory on the node's disk mounted).
	ShmTmpfs bool `json:"shmTmpfs,omitempty"`
}

// Open reads the state file; it starts and stops nothing.
func Open(opts Options) (*Manager, error) {
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.ShmSize == 0 {
		opts.ShmSize = DefaultShmSize
	}
	if opts.MemoryLimit == 0 {
		opts.MemoryLimit = DefaultMemoryLimit
	}
	if opts.Mask == nil {
		opts.Mask = DefaultMask
	}
	if !opts.Cgroup.Valid() {
		return nil, fmt.Errorf("MPS daemons: cgroup %q: want %q, %q or an absolute cgroup path", opts.Cgroup, CgroupSame, CgroupBesidePod)
	}
	l, err := state.OpenLedger[record](opts.StateFile)
	if err != nil {
		return nil, fmt.Errorf("MPS daemons: %w", err)
	}
	return &Manager{opts: opts, state: l}, nil
}

// Dirs are a daemon's directories.
func (m *Manager) Dirs(id string) Dirs { return DirsOf(m.opts.Dir, id) }

// IDs lists the recorded daemons.
func (m *Manager) IDs() []string { return m.state.Keys() }

// Spec is a recorded daemon's spec.
func (m *Manager) Spec(id string) (Spec, bool) {
	r, ok := m.state.Get(id)
	return r.Spec, ok
}

// Start makes sure the daemon of a spec runs: one that is recorded and
// answers is left as it is (started by an earlier call or agent);
// otherwise it is recorded, then started, then given its defaults. On
// error the daemon stays recorded for Stop (or Supervise) to finish. A ctx
// cancelled before the launch starts nothing; one cancelled during it
// does not cut it short (the daemon's PID is recorded, for Stop).
func (m *Manager) Start(ctx context.Context, s Spec) error {
	defer m.locks.Lock(s.ID)()
	if r, ok := m.state.Get(s.ID); ok && slices.Equal(r.Spec.Devices, s.Devices) && m.alive(ctx, r) == nil {
		return nil
	}
	return m.start(ctx, s)
}

// start starts the daemon anew; the caller holds its lock.
func (m *Manager) start(ctx context.Context, s Spec) error {
	prev, recorded := m.state.Get(s.ID)
	if recorded {
		// A daemon that no longer answers, or a leftover: gone first.
		// Only the process the agent launched is signalled. One that
		// outlives SIGKILL (stuck in the driver) keeps its pipe: no
		// second daemon beside it.
		if err := m.kill(ctx, prev, 0); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err // nothing launched
	}
	r := record{Spec: s}
	if os.Geteuid() == 0 {
		r.ShmTmpfs = !recorded || prev.ShmTmpfs
		if m.opts.Cgroup != CgroupSame {
			r.Cgroup = cgroupName(s.ID)
		}
	}
	if err := m.state.Put(s.ID, r); err != nil {
		return err
	}
	if err := m.prepareDirs(r, !recorded); err != nil {
		return fmt.Errorf("MPS daemon %s: %w", s.ID, err)
	}
	// Once launched, the daemon runs in a session of its own: the agent
	// must learn it is there, or no Stop could end it. So the launch and
	// the wait for it go on when ctx is cancelled (the lab interrupted);
	// each is bounded by the timeout.
	r, err := m.launch(context.WithoutCancel(ctx), r)
	if err != nil {
		return err
	}
	if r, err = m.ready(context.WithoutCancel(ctx), r); err != nil {
		return err
	}
	for _, c := range s.Commands() {
		if _, err := m.control(ctx, s.ID, c); err != nil {
			return err
		}
	}
	if p := s.ActiveThreadPercentage; p != nil {
		// The control program's exit status need not say whether the
		// daemon took a value: it is read back.
		out, err := m.control(ctx, s.ID, "get_default_active_thread_percentage")
		if v, perr := strconv.ParseFloat(strings.TrimSpace(out), 64); err != nil || perr != nil || int(v) != *p {
			return fmt.Errorf("MPS daemon %s: the default active thread percentage is %q, not %d (%v)", s.ID, strings.TrimSpace(out), *p, err)
		}
	}
	klog.FromContext(ctx).Info("Started an MPS control daemon", "daemon", s.ID, "devices", s.Devices, "pid", r.PID, "cgroup", r.Cgroup)
	return nil
}

// env is what the control program gets: the driver's programs and
// libraries, and extra. Nothing of the agent's own environment (its
// service account, the API server's address) reaches it.
func (m *Manager) env(extra ...string) []string {
	env := []string{"PATH=" + m.opts.Programs.Bin + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if lp := m.opts.Programs.LibraryPath; len(lp) > 0 {
		env = append(env, "LD_LIBRARY_PATH="+strings.Join(lp, ":"))
	}
	return append(env, extra...)
}

// helperEnv is env for the programs the agent runs and waits for (the
// control program as a client, the launcher removing a cgroup; not the
// daemon, whose environment is its own variables alone): with the race
// detector's options where the agent has them (GORACE). A race-built
// agent's launcher is itself, and on mock hardware the control program
// is too; each sleeps a second before it exits by default
// (atexit_sleep_ms), which CI's race stage sets to 0.
func (m *Manager) helperEnv(extra ...string) []string {
	env := m.env(extra...)
	if v, ok := os.LookupEnv("GORACE"); ok {
		env = append(env, "GORACE="+v)
	}
	return env
}

// launch starts nvidia-cuda-mps-control -f through the launcher, which
// becomes the daemon: the PID its start returns is the daemon's, and it
// is recorded at once. It returns once the launcher has exec'd the
// control program (or failed).
func (m *Manager) launch(ctx context.Context, r record) (record, error) {
	s, d := r.Spec, m.Dirs(r.Spec.ID)
	if err := m.opts.Programs.Check(Control); err != nil {
		return r, fmt.Errorf("MPS daemon %s: %w", s.ID, err)
	}
	req := request{Capabilities: DaemonCapabilities, Env: m.env(s.env(d)...), Program: m.opts.Programs.Path(Control)}
	attr := &syscall.SysProcAttr{Setsid: true}
	if os.Geteuid() == 0 {
		// Without root there are no mount namespaces: the daemon keeps
		// this process's mounts (tests without root).
		attr.Unshareflags = syscall.CLONE_NEWNS
		req.Shm, req.Detach, req.Mask = d.Shm, m.opts.Dir, m.opts.Mask
		req.Cgroup, req.CgroupName, req.MemoryMax = m.opts.Cgroup, r.Cgroup, m.opts.MemoryLimit
	}
	raw, err := json.Marshal(req)
	if err != nil {
		return r, err
	}
	// The daemon's output goes to a file of its own: it outlives this
	// process.
	out, err := os.OpenFile(filepath.Join(d.Log, daemonOutput), os.O_WRONLY|os.O_APPEND|os.O_CREATE|unix.O_NOFOLLOW, 0o640)
	if err != nil {
		return r, fmt.Errorf("MPS daemon %s: %w", s.ID, err)
	}
	defer out.Close()
	status, statusW, err := os.Pipe()
	if err != nil {
		return r, err
	}
	defer status.Close()
	cmd := &exec.Cmd{Path: "/proc/self/exe", Args: []string{launcherName, string(raw), Control, "-f"},
		Env: req.Env, Stdout: out, Stderr: out, ExtraFiles: []*os.File{statusW}, SysProcAttr: attr}
	err = cmd.Start()
	statusW.Close()
	if err != nil {
		return r, fmt.Errorf("MPS daemon %s: starting %s: %w", s.ID, launcherName, err)
	}
	r.PID = cmd.Process.Pid
	// Read before anything waits for the process: until then its PID
	// stays its own, even once it ended.
	r.StartTime, err = procstat.StartTime(r.PID)
	go func() { _ = cmd.Wait() }() // reaps it when it ends, while this agent runs
	if err == nil {
		err = m.state.Put(s.ID, r)
	}
	if err != nil {
		_ = cmd.Process.Kill() // not recorded: no Stop would find it
		return r, fmt.Errorf("MPS daemon %s: %w%s", s.ID, err, logTail(d.Log))
	}
	_ = status.SetReadDeadline(time.Now().Add(m.opts.Timeout))
	said, err := io.ReadAll(io.LimitReader(status, 4096))
	if len(said) > 0 || err != nil {
		// A launcher that failed or hangs is still this process's child,
		// whose PID no other process can have: ended here, as no record
		// would name it (it runs no control program).
		_ = cmd.Process.Kill()
		return r, fmt.Errorf("MPS daemon %s: %s: %s%v%s", s.ID, launcherName, said, err, logTail(d.Log))
	}
	return r, nil
}

// ready waits until the launched daemon answers on its control pipe and
// records what it runs.
func (m *Manager) ready(ctx context.Context, r record) (record, error) {
	id, d := r.Spec.ID, m.Dirs(r.Spec.ID)
	fd, err := unix.PidfdOpen(r.PID, 0)
	if err != nil {
		return r, fmt.Errorf("MPS daemon %s: exited at start%s", id, logTail(d.Log))
	}
	p := &process{pid: r.PID, fd: fd}
	defer p.close()
	// The launcher has exec'd the program (the status pipe closed on
	// exec): the process runs it now.
	exe, err := statID(fmt.Sprintf("/proc/%d/exe", r.PID))
	want, werr := statID(m.opts.Programs.Path(Control))
	if err != nil || werr != nil || exe != want {
		_ = p.signal(unix.SIGKILL) // the agent's own child, which no record would name
		return r, fmt.Errorf("MPS daemon %s: process %d runs no %s (%v, %v)%s", id, r.PID, m.opts.Programs.Path(Control), err, werr, logTail(d.Log))
	}
	r.Exe = &exe
	if err := m.state.Put(id, r); err != nil {
		return r, err
	}
	deadline := time.Now().Add(m.opts.Timeout)
	for {
		_, err := m.control(ctx, id, "get_server_list")
		switch {
		case err == nil:
			return r, nil
		case p.exited(0):
			return r, fmt.Errorf("MPS daemon %s: exited at start: %w%s", id, err, logTail(d.Log))
		case time.Now().After(deadline):
			return r, fmt.Errorf("MPS daemon %s: does not answer within %v: %w%s", id, m.opts.Timeout, err, logTail(d.Log))
		}
		if p.exited(10 * time.Millisecond) {
			continue // said above
		}
	}
}

// controlPipe is the daemon's control pipe in its pipe directory.
const controlPipe = "control"

// control sends one command to a daemon through the control program.
// The pipe directory is the clients': a link there is a client's, and
// the control program would follow it to wherever it points.
func (m *Manager) control(ctx context.Context, id, command string) (string, error) {
	pipe := m.Dirs(id).Pipe
	if fi, err := os.Lstat(filepath.Join(pipe, controlPipe)); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return "", fmt.Errorf("MPS daemon %s: %q: its control pipe is a link (a client's)", id, command)
	}
	ctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.opts.Programs.Path(Control))
	cmd.Env, cmd.WaitDelay = m.helperEnv(PipeDirEnv+"="+pipe), time.Second
	cmd.Stdin = strings.NewReader(command + "\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &limitedBuffer{b: &stdout, n: 64 << 10}, &limitedBuffer{b: &stderr, n: 4096}
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("MPS daemon %s: %q: %w: %s", id, command, err, strings.TrimSpace(stderr.String()+stdout.String()))
	}
	return stdout.String(), nil
}

// limitedBuffer keeps the first n bytes written to it: a control
// program's answer comes from whatever listens on the pipe.
type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// alive checks a recorded daemon: its process runs (the one launched),
// its control pipe is its own (the daemon listens there, not a client)
// and answers.
func (m *Manager) alive(ctx context.Context, r record) error {
	p, err := m.open(r)
	if err != nil {
		return err
	}
	p.close()
	if peer, err := controlPeer(m.Dirs(r.Spec.ID).Pipe); err != nil {
		return fmt.Errorf("MPS daemon %s: its control pipe: %w", r.Spec.ID, err)
	} else if peer != 0 && peer != r.PID {
		return fmt.Errorf("MPS daemon %s: process %d listens on its control pipe, not the daemon %d (a client's)", r.Spec.ID, peer, r.PID)
	}
	_, err = m.control(ctx, r.Spec.ID, "get_server_list")
	return err
}

// Check reports whether a recorded daemon runs and answers.
func (m *Manager) Check(ctx context.Context, id string) error {
	r, ok := m.state.Get(id)
	if !ok {
		return fmt.Errorf("MPS daemon %s is not recorded", id)
	}
	return m.alive(ctx, r)
}

// Stop stops a daemon (quit, then a signal for one that does not go),
// ends what is left in its cgroup and removes it, unmounts its shared
// memory and removes its directories and record. A daemon that is not
// recorded is stopped already.
func (m *Manager) Stop(ctx context.Context, id string) error {
	defer m.locks.Lock(id)()
	r, ok := m.state.Get(id)
	if !ok {
		return nil
	}
	if m.alive(ctx, r) == nil {
		// quit ends the daemon, and its servers once their clients are
		// done: those are the claim's, which is being unprepared.
		_, _ = m.control(ctx, id, "quit")
	}
	if err := m.kill(ctx, r, 2*time.Second); err != nil {
		return err
	}
	if err := m.removeCgroup(ctx, r); err != nil {
		return fmt.Errorf("MPS daemon %s: %w", id, err)
	}
	if err := unmountShm(m.Dirs(id).Shm); err != nil {
		return fmt.Errorf("MPS daemon %s: %w", id, err)
	}
	if err := os.RemoveAll(filepath.Join(m.opts.Dir, id)); err != nil {
		return err
	}
	if err := m.state.Delete(id); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Stopped an MPS control daemon", "daemon", id, "pid", r.PID)
	return nil
}

// kill ends a recorded daemon's process if it still runs, and what is
// left in its cgroup: the process is given grace to end (after a quit),
// then SIGTERM, then SIGKILL, through a pidfd. A process under the
// recorded PID that is not the daemon is left alone.
func (m *Manager) kill(ctx context.Context, r record, grace time.Duration) error {
	p, err := m.open(r)
	switch {
	case err == nil:
		ended := p.stop(grace)
		p.close()
		if !ended {
			return fmt.Errorf("MPS daemon %s: process %d does not end", r.Spec.ID, r.PID)
		}
	case errors.Is(err, errNotOurs):
		klog.FromContext(ctx).Info("The process under an MPS daemon's recorded PID is not the daemon: left alone", "daemon", r.Spec.ID, "pid", r.PID, "why", err.Error())
	}
	if r.Cgroup != "" {
		if err := endCgroup(r.Cgroup); err != nil {
			return fmt.Errorf("MPS daemon %s: %w", r.Spec.ID, err)
		}
	}
	return nil
}

// removeCgroup removes a daemon's own cgroup, through the launcher (it
// is reached as the node sees it).
func (m *Manager) removeCgroup(ctx context.Context, r record) error {
	if r.Cgroup == "" {
		return nil
	}
	raw, err := json.Marshal(request{Remove: true, Cgroup: m.opts.Cgroup, CgroupName: r.Cgroup})
	if err != nil {
		return err
	}
	status, statusW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer status.Close()
	ctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/proc/self/exe")
	cmd.Args, cmd.Env, cmd.ExtraFiles = []string{launcherName, string(raw)}, m.helperEnv(), []*os.File{statusW}
	err = cmd.Start()
	statusW.Close()
	if err != nil {
		return err
	}
	said, _ := io.ReadAll(io.LimitReader(status, 4096))
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("removing cgroup %s: %w: %s", r.Cgroup, err, said)
	}
	return nil
}

// PID is a recorded daemon's process ID (0 before it ran).
func (m *Manager) PID(id string) int {
	r, _ := m.state.Get(id)
	return r.PID
}

// Supervise checks every recorded daemon and starts each that is down
// again. It returns the daemons it found down, with why.
//
// A daemon is down when its process is gone, or when its control pipe
// does not answer: a client can delete the pipe (its directory is
// mounted read-write into every client), and then no new client and not
// the agent reach the daemon. Either way it is started again, with its
// defaults: the process the agent launched, and only that one, is ended
// first (killing it ends its MPS servers, and every client on them
// fails, as a fatal fault of one client's would end them all: only a
// dedicated share or a MIG partition is out of reach of other tenants),
// and a process of anyone else under its PID is never signalled.
func (m *Manager) Supervise(ctx context.Context) map[string]error {
	down := map[string]error{}
	for _, id := range m.IDs() {
		unlock := m.locks.Lock(id)
		r, ok := m.state.Get(id)
		if !ok { // stopped meanwhile
			unlock()
			continue
		}
		if err := m.alive(ctx, r); err != nil {
			down[id] = err
			klog.FromContext(ctx).Error(err, "An MPS control daemon is down: starting it again", "daemon", id, "devices", r.Spec.Devices)
			if serr := m.start(ctx, r.Spec); serr != nil {
				down[id] = fmt.Errorf("%w; starting it again: %w", err, serr)
			}
		}
		unlock()
	}
	return down
}
