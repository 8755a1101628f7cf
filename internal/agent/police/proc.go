// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package police

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/procstat"
)

// proc is one process as /proc shows it, held by a pidfd: a signal sent
// through it reaches this process, never one that took its PID later.
type proc struct {
	pidfd int
	pid   uint32
	dir   string // its /proc directory
	start uint64 // start time (clock ticks after boot): with the PID, its identity
	// pod and container are what its cgroup names (containerOf); inPod
	// false for a process of no pod, whose command (comm) is read.
	pod       types.UID
	container string
	inPod     bool
	comm      string
}

// errGone: the process exited (or is a zombie, whose context is gone).
var errGone = errors.New("process gone")

// inspect opens the process with a pidfd first, then reads /proc under
// root, then checks through the pidfd that it still lives: what was read
// was that process's, as a PID is not reused while its process exists.
func inspect(root string, pid uint32) (*proc, error) {
	fd, err := unix.PidfdOpen(int(pid), 0)
	if errors.Is(err, unix.ESRCH) {
		return nil, errGone
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd_open(%d): %w", pid, err)
	}
	p := &proc{pidfd: fd, pid: pid, dir: filepath.Join(root, strconv.FormatUint(uint64(pid), 10))}
	if err := p.read(); err != nil {
		p.close()
		return nil, err
	}
	if !p.alive() {
		p.close()
		return nil, errGone
	}
	return p, nil
}

// alive: the process has not been reaped, so its PID is still its own
// (a zombie's too: a PID is freed when it is reaped).
func (p *proc) alive() bool { return unix.PidfdSendSignal(p.pidfd, 0, nil, 0) == nil }

func (p *proc) read() error {
	dir := p.dir
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return errGone
	}
	if err != nil {
		return err
	}
	state, start, err := procstat.Parse(stat)
	if err != nil {
		return fmt.Errorf("%s/stat: %w", dir, err)
	}
	if state == 'Z' || state == 'X' {
		return errGone
	}
	p.start = start
	cgroup, err := os.ReadFile(filepath.Join(dir, "cgroup"))
	if err != nil {
		return fmt.Errorf("%s/cgroup: %w", dir, err)
	}
	p.pod, p.container, p.inPod = containerOf(string(cgroup))
	if !p.inPod {
		// Only a process outside pods may be the MPS server.
		if comm, err := os.ReadFile(filepath.Join(dir, "comm")); err == nil {
			p.comm = strings.TrimSpace(string(comm))
		}
	}
	return nil
}

// environment reads the MPS limits in the process's environment through
// s, at most limit bytes of it; errGone if the process went meanwhile
// (what was read may then be another's).
func (p *proc) environment(s *envScanner, limit int64) (startLimits, error) {
	f, err := os.Open(filepath.Join(p.dir, "environ"))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return startLimits{}, errGone
	}
	if err != nil {
		return startLimits{}, err
	}
	l, err := s.scan(f, limit)
	_ = f.Close()
	if !p.alive() || errors.Is(err, unix.ESRCH) {
		return startLimits{}, errGone
	}
	return l, err
}

// clockTicks is the kernel's USER_HZ, the unit of a start time in
// /proc/<pid>/stat: 100 on every Linux architecture the agent runs on.
const clockTicks = 100

// bootTicks is the time since boot (CLOCK_BOOTTIME, the clock of start
// times) in clock ticks: a process whose start time is later did not
// exist then.
func bootTicks() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return ^uint64(0) // cannot tell: rule nothing out
	}
	return uint64(ts.Nano() / int64(time.Second/clockTicks))
}

// kill sends SIGKILL through the pidfd: the process cannot catch it, and
// its GPU context goes with it.
func (p *proc) kill() error {
	if err := unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

func (p *proc) close() { _ = unix.Close(p.pidfd) }
