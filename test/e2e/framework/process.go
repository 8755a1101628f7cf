// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hwdra/hwdra/internal/waitfor"
)

// Process is one running component. Its output goes to a log file that the
// harness shows when a test fails.
type Process struct {
	Name    string
	Path    string
	Args    []string
	Env     []string
	LogPath string

	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start runs the process in its own process group, so that stopping it also
// stops what it forked without touching the test binary.
func (p *Process) Start() error {
	if err := os.MkdirAll(filepath.Dir(p.LogPath), 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "--- %s: %s %s\n", time.Now().Format(time.RFC3339Nano), p.Path, strings.Join(p.Args, " "))
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	p.cmd, p.done, p.err = cmd, make(chan struct{}), nil
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return nil
}

// Running reports whether the process has been started and not exited.
func (p *Process) Running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// ExitErr is the process's exit error once it has exited.
func (p *Process) ExitErr() error {
	if p.Running() || p.cmd == nil {
		return nil
	}
	return p.err
}

// Pid is the process ID, 0 before Start.
func (p *Process) Pid() int {
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Stop sends SIGTERM to the process group and SIGKILL after grace.
func (p *Process) Stop(grace time.Duration) {
	if !p.Running() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// Kill sends SIGKILL to the process group and waits for the exit: the crash
// the agent must survive.
func (p *Process) Kill() {
	if !p.Running() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Restart stops the process (SIGTERM) and starts it again with the same
// arguments.
func (p *Process) Restart(grace time.Duration) error {
	p.Stop(grace)
	return p.Start()
}

// Tail returns the last n lines of the process's log.
func (p *Process) Tail(n int) string {
	data, err := os.ReadFile(p.LogPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// LogSize is the current length of a component's log ("hwdra-agent"),
// before it starts: a starting point for Process.WaitLog.
func (n *Node) LogSize(name string) int64 {
	st, err := os.Stat(filepath.Join(n.Root, "logs", name+".log"))
	if err != nil {
		return 0
	}
	return st.Size()
}

// NRISynced is what the agent logs once its NRI plugin is connected to
// containerd and synchronized: from then on it prepares NIC claims.
const NRISynced = "Synchronized with the container runtime"

// WaitLog waits until the process's log, after offset since, has a line
// containing want.
func (p *Process) WaitLog(ctx context.Context, since int64, want string, timeout time.Duration) error {
	return waitfor.Until(ctx, fmt.Sprintf("%s: %q in its log", p.Name, want), timeout, func() bool {
		data, err := readFrom(p.LogPath, since)
		return err == nil && strings.Contains(string(data), want)
	})
}
