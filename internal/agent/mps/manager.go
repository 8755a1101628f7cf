package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

// Options configure a Manager.
type Options struct {
	// Dir holds the daemons' directories (<state>/mps) and StateFile
	// records them.
	Dir, StateFile string
	// Programs are the driver's programs: Control comes from there.
	Programs nvml.Programs
	// Cgroup is where daemons' processes go.
	Cgroup Cgroup
	// Timeout bounds each call of the control program (default 10s).
	Timeout time.Duration
}

// Manager starts, adopts, watches and stops control daemons. Each
// daemon is recorded (StateFile) before anything of it is made, so one
// that an agent started is found again by the next: by its PID and start
// time, and through its control pipe.
type Manager struct {
	opts  Options
	state *state.Ledger[record]
	locks keyedlock.Locks
}

// record is a daemon as the state file keeps it.
type record struct {
	Spec Spec `json:"spec"`
	// PID and StartTime (clock ticks after boot, /proc/<pid>/stat) name
	// the daemon's process once it runs: a PID reused by another process
	// has another start time.
	PID       int    `json:"pid,omitempty"`
	StartTime uint64 `json:"startTime,omitempty"`
}

// Open reads the state file; it starts and stops nothing.
func Open(opts Options) (*Manager, error) {
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Second
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
	if r, ok := m.state.Get(s.ID); ok {
		// A process that no longer answers, or a leftover: gone first. One
		// that outlives SIGKILL (stuck in the driver) keeps its pipe: no
		// second daemon beside it.
		if err := m.kill(r); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err // nothing launched
	}
	if err := m.state.Put(s.ID, record{Spec: s}); err != nil {
		return err
	}
	d := m.Dirs(s.ID)
	for _, dir := range []string{d.Pipe, d.Log, d.Shm} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	// Clients run as any user: they must reach the pipe and share memory.
	if err := os.Chmod(d.Shm, 0o1777); err != nil {
		return err
	}
	// Once launched, the daemon runs in a session of its own: whoever
	// launched it must learn its PID, or no Stop could end it. So the
	// launch and the wait for the PID go on when ctx is cancelled (the
	// lab interrupted); each is bounded by the timeout.
	if err := m.launch(context.WithoutCancel(ctx), s, d); err != nil {
		return err
	}
	r, err := waitPID(context.WithoutCancel(ctx), d.Pipe, m.opts.Timeout)
	if err != nil {
		return err
	}
	r.Spec = s
	if err := m.state.Put(s.ID, r); err != nil {
		return err
	}
	if _, err := m.control(ctx, s.ID, "get_server_list"); err != nil {
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
	klog.FromContext(ctx).Info("Started an MPS control daemon", "daemon", s.ID, "devices", s.Devices, "pid", r.PID)
	return nil
}

// launch runs nvidia-cuda-mps-control -d through the launcher, which
// returns once the daemon is in the background.
func (m *Manager) launch(ctx context.Context, s Spec, d Dirs) error {
	if err := m.opts.Programs.Check(Control); err != nil {
		return fmt.Errorf("MPS daemon %s: %w", s.ID, err)
	}
	ctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	control := m.opts.Programs.Command(ctx, Control, s.env(d), "-d")
	shm, attr := "", &syscall.SysProcAttr{Setsid: true}
	cgroup := m.opts.Cgroup
	if os.Geteuid() == 0 {
		shm, attr.Unshareflags = d.Shm, syscall.CLONE_NEWNS
	} else {
		// Without root there are no mount namespaces: the daemon keeps
		// this process's /dev/shm (tests without root).
		cgroup = CgroupSame
	}
	cmd := exec.CommandContext(ctx, "/proc/self/exe")
	cmd.Args = append([]string{launcherName, shm, string(cgroup)}, control.Args...)
	cmd.Args[3] = control.Path
	cmd.Env, cmd.SysProcAttr, cmd.WaitDelay = control.Env, attr, time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("MPS daemon %s: %s -d: %w: %s%s", s.ID, control.Path, err, strings.TrimSpace(out.String()), logTail(d.Log))
	}
	return nil
}

// logTail is the end of a daemon's log, for errors.
func logTail(dir string) string {
	data, err := os.ReadFile(filepath.Join(dir, "control.log"))
	if err != nil || len(data) == 0 {
		return ""
	}
	if len(data) > 512 {
		data = data[len(data)-512:]
	}
	return " (control.log: " + strings.TrimSpace(string(data)) + ")"
}

// pidFile is where the daemon writes its PID, in its pipe directory.
const pidFile = "nvidia-cuda-mps-control.pid"

// waitPID waits for the daemon's PID file and reads the process's start
// time.
func waitPID(ctx context.Context, pipe string, timeout time.Duration) (record, error) {
	deadline := time.Now().Add(timeout)
	for {
		data, err := os.ReadFile(filepath.Join(pipe, pidFile))
		if err == nil {
			pid, perr := strconv.Atoi(strings.TrimSpace(string(data)))
			if st, serr := procstat.StartTime(pid); perr == nil && serr == nil {
				return record{PID: pid, StartTime: st}, nil
			}
		}
		if time.Now().After(deadline) {
			return record{}, fmt.Errorf("the MPS control daemon wrote no PID file %s within %v: %v", filepath.Join(pipe, pidFile), timeout, err)
		}
		select {
		case <-ctx.Done():
			return record{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// control sends one command to a daemon through the control program.
func (m *Manager) control(ctx context.Context, id, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	cmd := m.opts.Programs.Command(ctx, Control, []string{PipeDirEnv + "=" + m.Dirs(id).Pipe})
	cmd.Stdin = strings.NewReader(command + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("MPS daemon %s: %q: %w: %s", id, command, err, strings.TrimSpace(stderr.String()+string(out)))
	}
	return string(out), nil
}

// alive checks a recorded daemon: its process runs (the same process:
// PID and start time) and its control pipe answers.
func (m *Manager) alive(ctx context.Context, r record) error {
	if r.PID == 0 {
		return errors.New("never started")
	}
	if st, err := procstat.StartTime(r.PID); err != nil || st != r.StartTime {
		return fmt.Errorf("process %d is gone", r.PID)
	}
	_, err := m.control(ctx, r.Spec.ID, "get_server_list")
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

// Stop stops a daemon (quit, then a signal for one that does not go) and
// removes its directories and record. A daemon that is not recorded is
// stopped already.
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
	if err := m.kill(r); err != nil {
		return err
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

// kill ends a recorded daemon's process if it still runs: it is given
// a moment (after a quit), then SIGTERM, then SIGKILL. Signals go through
// a pidfd opened while the PID is confirmed to be the daemon (its start
// time): a PID reused since (by a tenant's process) is never signalled,
// not even in the moment between the check and the signal.
func (m *Manager) kill(r record) error {
	if r.PID <= 0 {
		return nil
	}
	fd, err := unix.PidfdOpen(r.PID, 0)
	if err != nil {
		return nil // gone (ESRCH)
	}
	defer unix.Close(fd)
	running := func() bool {
		// The pidfd names the process opened; the start time confirms it
		// was the daemon's (a pidfd of a reused PID reads another one,
		// and /proc of an ended one reads nothing or another process).
		st, err := procstat.StartTime(r.PID)
		return err == nil && st == r.StartTime && unix.PidfdSendSignal(fd, 0, nil, 0) == nil
	}
	for _, sig := range []syscall.Signal{0, syscall.SIGTERM, syscall.SIGKILL} {
		if !running() {
			return nil
		}
		if sig != 0 {
			_ = unix.PidfdSendSignal(fd, sig, nil, 0)
		}
		for deadline := time.Now().Add(2 * time.Second); running() && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !running() {
		return nil
	}
	return fmt.Errorf("MPS daemon %s: process %d does not end", r.Spec.ID, r.PID)
}

// PID is a recorded daemon's process ID (0 before it ran).
func (m *Manager) PID(id string) int {
	r, _ := m.state.Get(id)
	return r.PID
}

// Supervise checks every recorded daemon and starts each that is down
// again. It returns the daemons it found down, with why.
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
