// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package mps

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/procstat"
)

// A daemon's identity is what the agent launched, never what its pipe
// directory says: every MPS client mounts that directory read-write, and
// a tenant can write any PID into the daemon's PID file there. The agent
// records the PID its own fork returned, the process's start time, the
// executable it runs and its cgroup in its state file (which no tenant
// reaches), checks a process against all of them before it signals it,
// and signals it through a pidfd, which names that process and no other
// that gets its PID later.

// fileID is a file by device and inode: what /proc/<pid>/exe is.
type fileID struct {
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

func statID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{Dev: st.Dev, Ino: st.Ino}, nil
}

var (
	// errGone: the recorded daemon no longer runs.
	errGone = errors.New("not running")
	// errNotOurs: a process runs under the recorded PID, but not the
	// daemon the agent launched.
	errNotOurs = errors.New("not the daemon the agent launched")
)

// process is a daemon's process, held by a pidfd.
type process struct {
	pid int
	fd  int
}

// open finds the recorded daemon's process: the process that has its
// PID now, held by a pidfd, if it is the one the record names: the same
// start time (a PID reused by another process has another), the driver's
// control program (the executable recorded at launch, or for a record
// of an earlier agent the control program now), the daemon's pipe
// directory in its environment (each daemon has its own), and its cgroup
// where it has one of its own. The identity is read after the pidfd is
// open, so that it is the pidfd's process's: one that ended meanwhile
// reads as gone.
func (m *Manager) open(r record) (*process, error) {
	if r.PID <= 0 {
		return nil, fmt.Errorf("%w: never started", errGone)
	}
	fd, err := unix.PidfdOpen(r.PID, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: process %d: %v", errGone, r.PID, err)
	}
	p := &process{pid: r.PID, fd: fd}
	if err := m.identify(p, r); err != nil {
		p.close()
		return nil, err
	}
	if p.exited(0) {
		p.close()
		return nil, fmt.Errorf("%w: process %d has exited", errGone, r.PID)
	}
	return p, nil
}

// identify checks that the process is the recorded daemon.
func (m *Manager) identify(p *process, r record) error {
	st, err := procstat.StartTime(p.pid)
	switch {
	case err != nil:
		return fmt.Errorf("%w: process %d: %v", errGone, p.pid, err)
	case st != r.StartTime:
		return fmt.Errorf("%w: process %d started at %d, the daemon at %d (the PID was reused)", errGone, p.pid, st, r.StartTime)
	}
	want := r.Exe
	if want == nil {
		id, err := statID(m.opts.Programs.Path(Control))
		if err != nil {
			return fmt.Errorf("%w: %v", errNotOurs, err)
		}
		want = &id
	}
	if exe, err := statID(fmt.Sprintf("/proc/%d/exe", p.pid)); err != nil || exe != *want {
		return fmt.Errorf("%w: process %d runs another program than %s (%v)", errNotOurs, p.pid, m.opts.Programs.Path(Control), err)
	}
	pipe := PipeDirEnv + "=" + m.Dirs(r.Spec.ID).Pipe
	if env, err := readBounded(fmt.Sprintf("/proc/%d/environ", p.pid), maxDaemonEnv); err != nil || !bytes.Contains(append([]byte{0}, env...), append(append([]byte{0}, pipe...), 0)) {
		return fmt.Errorf("%w: process %d has not %s in its environment (%v)", errNotOurs, p.pid, pipe, err)
	}
	if r.Cgroup != "" && !inCgroup(p.pid, r.Cgroup) {
		return fmt.Errorf("%w: process %d is not in cgroup %s", errNotOurs, p.pid, r.Cgroup)
	}
	return nil
}

// maxDaemonEnv bounds what is read of a daemon's environment: the agent
// gives it a few variables.
const maxDaemonEnv = 64 << 10

// readBounded reads at most max bytes of a file.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max))
	if len(data) > 0 && data[len(data)-1] != 0 {
		data = append(data, 0)
	}
	return data, err
}

// inCgroup reports whether a process is in a cgroup of that name, in
// any hierarchy. The name is the last element of the path, which reads
// the same from any cgroup namespace (a new agent pod has its own).
func inCgroup(pid int, name string) bool {
	data, err := readBounded(fmt.Sprintf("/proc/%d/cgroup", pid), 64<<10)
	if err != nil {
		return false
	}
	sc := bufio.NewScanner(bytes.NewReader(bytes.TrimRight(data, "\x00")))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 && filepath.Base(parts[2]) == name {
			return true
		}
	}
	return false
}

// cgroupMembers are the processes in a cgroup of that name, by a scan of
// /proc (the agent shares the node's PID namespace).
func cgroupMembers(name string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && inCgroup(pid, name) {
			out = append(out, pid)
		}
	}
	return out
}

func (p *process) close() { _ = unix.Close(p.fd) }

// exited waits up to timeout for the process to end and reports whether
// it has (a zombie has).
func (p *process) exited(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(max(0, time.Until(deadline).Milliseconds())))
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0
	}
}

// signal sends a signal to the process itself, whatever process has its
// PID by now.
func (p *process) signal(sig unix.Signal) error {
	err := unix.PidfdSendSignal(p.fd, sig, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil // ended already
	}
	return err
}

// stop ends the process: it is given grace to end by itself (after a
// quit), then SIGTERM, then SIGKILL, each with a moment to end. It
// reports whether the process ended.
func (p *process) stop(grace time.Duration) bool {
	if p.exited(grace) {
		return true
	}
	for _, sig := range []unix.Signal{unix.SIGTERM, unix.SIGKILL} {
		if err := p.signal(sig); err != nil {
			return false
		}
		if p.exited(2 * time.Second) {
			return true
		}
	}
	return false
}

// endCgroup ends every process left in the daemon's cgroup (MPS servers
// whose daemon was killed): each is in that cgroup, which only the
// daemon's processes are, when it is signalled through its pidfd.
func endCgroup(name string) error {
	var left []int
	for _, pid := range cgroupMembers(name) {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // ended
		}
		p := &process{pid: pid, fd: fd}
		if inCgroup(pid, name) && !p.stop(0) {
			left = append(left, pid)
		}
		p.close()
	}
	if len(left) > 0 {
		return fmt.Errorf("processes %v of cgroup %s do not end", left, name)
	}
	return nil
}

// controlPeer is the process that listens on a daemon's control pipe,
// where that is a Unix socket (the driver's own and the mock's are): 0
// where it is no socket (a FIFO: nothing to ask). A tenant can delete
// the pipe and listen there itself: its process then answers the
// control program for the daemon, and new clients.
func controlPeer(pipe string) (int, error) {
	fi, err := os.Lstat(filepath.Join(pipe, controlPipe))
	if err != nil {
		return 0, err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return 0, nil
	}
	dir, err := os.Open(pipe)
	if err != nil {
		return 0, err
	}
	defer dir.Close()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	// Through the directory's descriptor: a socket's path has at most
	// 107 bytes, a pipe directory's need not.
	addr := &unix.SockaddrUnix{Name: fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), controlPipe)}
	if err := unix.Connect(fd, addr); err != nil {
		return 0, err
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return 0, err
	}
	return int(cred.Pid), nil
}
