// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package drivertools

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// The MPS control daemon's environment and files, as the real one uses
// them.
const (
	PipeDirEnv     = "CUDA_MPS_PIPE_DIRECTORY"
	LogDirEnv      = "CUDA_MPS_LOG_DIRECTORY"
	VisibleEnv     = "CUDA_VISIBLE_DEVICES"
	defaultPipeDir = "/tmp/nvidia-mps"
	defaultLogDir  = "/var/log/nvidia-mps"
	// PIDFile is the daemon's PID, in the pipe directory.
	PIDFile = "nvidia-cuda-mps-control.pid"
	// controlSocket is where the mock daemon listens, in the pipe
	// directory (the real one keeps its own pipes there).
	controlSocket = "control"
	// LogFile is the daemon's log in the log directory; the mock's is a
	// record of what it was told, one JSON MPSEvent a line.
	LogFile = "control.log"
	// ShmMarkerPrefix names the file the mock daemon keeps in its
	// /dev/shm while it runs (a real server keeps its shared memory
	// there): a client that mounts the same directory sees it.
	ShmMarkerPrefix = "hwdra-mock-mps-"
)

// MPSEvent is one line of the mock daemon's log.
type MPSEvent struct {
	Time time.Time `json:"time"`
	PID  int       `json:"pid"`
	// Event is "start", "command" or "exit".
	Event string `json:"event"`
	// Command and Reply: a command and the daemon's answer; Failed when
	// it refused it.
	Command string `json:"command,omitempty"`
	Reply   string `json:"reply,omitempty"`
	Failed  bool   `json:"failed,omitempty"`
	// VisibleDevices is CUDA_VISIBLE_DEVICES at start, ShmMarker the
	// file it keeps in its /dev/shm ("" if it could not write one).
	VisibleDevices string `json:"visibleDevices,omitempty"`
	ShmMarker      string `json:"shmMarker,omitempty"`
}

// MPSLog reads what the mock daemons with a log directory were told, in
// order.
func MPSLog(logDir string) ([]MPSEvent, error) {
	f, err := os.Open(filepath.Join(logDir, LogFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []MPSEvent
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e MPSEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return out, fmt.Errorf("%s: %w", LogFile, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// mpsControl is nvidia-cuda-mps-control:
//
//	-d   start the control daemon in the background, return once it answers
//	-f   run the control daemon in the foreground
//	     (no flag) the client: each line of stdin is a command for the
//	     daemon of $CUDA_MPS_PIPE_DIRECTORY; its answers go to stdout
func mpsControl(args []string) int {
	pipe, logDir := envOr(PipeDirEnv, defaultPipeDir), envOr(LogDirEnv, defaultLogDir)
	var err error
	switch {
	case len(args) == 0:
		err = mpsClient(pipe, os.Stdin, os.Stdout)
	case args[0] == "-d":
		err = startDaemon(pipe, logDir)
	case args[0] == "-f":
		err = runDaemon(pipe, logDir, len(args) > 1 && args[1] == readyFlag)
		if err == nil && raceBuild {
			// The agent's Stop waits for the daemon to end, and a
			// race-built one would sleep a second first: its environment
			// is the daemon's own, without GORACE. Its exit status goes to
			// no one; what the detector found is in its stderr already.
			syscall.Exit(0)
		}
	default:
		err = fmt.Errorf("unknown option %q (want -d, -f or none)", args[0])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s (hwdra mock): %v\n", MPSControl, err)
		return 1
	}
	return 0
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// mpsClient sends each command line to the daemon and prints its answer.
// It fails on the first command the daemon refuses, or when no daemon
// listens.
func mpsClient(pipe string, in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		reply, ok, err := ask(pipe, line)
		if err != nil {
			return err
		}
		if reply != "" {
			fmt.Fprintln(out, reply)
		}
		if !ok {
			return fmt.Errorf("%s: %s", line, reply)
		}
	}
	return sc.Err()
}

// ask sends one command: one connection, the command, then the answer,
// whose first line is "OK" or "ERR".
func ask(pipe, command string) (reply string, ok bool, err error) {
	sock, done, err := socketPath(pipe)
	if err != nil {
		return "", false, fmt.Errorf("cannot find MPS control daemon process (pipe directory %s): %w", pipe, err)
	}
	defer done()
	conn, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return "", false, fmt.Errorf("cannot find MPS control daemon process (pipe directory %s): %w", pipe, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintln(conn, command); err != nil {
		return "", false, err
	}
	_ = conn.(*net.UnixConn).CloseWrite()
	data, err := io.ReadAll(conn)
	if err != nil {
		return "", false, err
	}
	status, rest, _ := strings.Cut(string(data), "\n")
	return strings.TrimRight(rest, "\n"), status == "OK", nil
}

// readyFlag follows -f where -d starts the daemon: it says on file
// descriptor 3 when it serves. As the real -d, -d learns nothing of the
// daemon from its pipe directory, which a client may have written.
const readyFlag = "--hwdra-mock-ready-fd=3"

// startDaemon starts this program as the daemon (-f) in a session of its
// own and waits until it serves; the daemon outlives this process.
func startDaemon(pipe, logDir string) error {
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	// What the daemon says outside its log goes to a file of its own: it
	// outlives this process's stderr.
	stderrPath := filepath.Join(logDir, "stderr.log")
	stderr, err := os.OpenFile(stderrPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer stderr.Close()
	// The running binary itself, wherever this process's mounts put it.
	ready, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer ready.Close()
	cmd := &exec.Cmd{Path: "/proc/self/exe", Args: []string{MPSControl, "-f", readyFlag}, Env: os.Environ(),
		Stderr: stderr, ExtraFiles: []*os.File{readyW}, SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	err = cmd.Start()
	readyW.Close()
	if err != nil {
		return err
	}
	said := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(ready); said <- b }()
	select {
	case b := <-said:
		if len(b) > 0 {
			return nil
		}
		err := cmd.Wait() // it closed its end: it exited
		out, _ := os.ReadFile(stderrPath)
		return fmt.Errorf("the daemon exited at start: %v: %s", err, strings.TrimSpace(string(out)))
	case <-time.After(10 * time.Second):
		return errors.New("the daemon did not answer within 10s")
	}
}

// socketPath is the control socket's address through an open descriptor
// of the pipe directory: a Unix socket's path has at most 107 bytes, a
// pipe directory's need not (a test's temp directory).
func socketPath(pipe string) (string, func(), error) {
	dir, err := os.Open(pipe)
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), controlSocket), func() { dir.Close() }, nil
}

func readPID(pipe string) (int, error) {
	data, err := os.ReadFile(filepath.Join(pipe, PIDFile))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}

// daemon is the mock control daemon's state.
type daemon struct {
	pipe    string
	devices []string
	log     *os.File

	mu      sync.Mutex
	threads float64        // default active thread percentage
	pinned  map[int]string // default pinned memory limit by device index
}

// runDaemon is the control daemon: it takes commands until quit or a
// signal. With ready, it says "ready" on file descriptor 3 once it
// serves.
func runDaemon(pipe, logDir string, ready bool) error {
	if _, _, err := ask(pipe, "get_server_list"); err == nil {
		pid, _ := readPID(pipe)
		return fmt.Errorf("an instance of this daemon is already running (pid %d) with pipe directory %s", pid, pipe)
	}
	for _, dir := range []string{pipe, logDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	logFile, err := os.OpenFile(filepath.Join(logDir, LogFile), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	sock := filepath.Join(pipe, controlSocket)
	os.Remove(sock)
	short, done, err := socketPath(pipe)
	if err != nil {
		return err
	}
	ln, err := net.Listen("unix", short)
	done()
	if err != nil {
		return err
	}
	d := &daemon{pipe: pipe, log: logFile, threads: 100, pinned: map[int]string{}}
	if v := os.Getenv(VisibleEnv); v != "" {
		d.devices = strings.Split(v, ",")
	}
	marker := filepath.Join("/dev/shm", ShmMarkerPrefix+strconv.Itoa(os.Getpid()))
	if os.WriteFile(marker, []byte(pipe+"\n"), 0o644) != nil {
		marker = ""
	}
	cleanup := func() {
		ln.Close()
		os.Remove(sock)
		os.Remove(filepath.Join(pipe, PIDFile))
		if marker != "" {
			os.Remove(marker)
		}
	}
	defer cleanup()
	if err := os.WriteFile(filepath.Join(pipe, PIDFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	d.record(MPSEvent{Event: "start", VisibleDevices: os.Getenv(VisibleEnv), ShmMarker: marker})
	if ready {
		f := os.NewFile(3, "ready")
		_, _ = f.Write([]byte("ready"))
		f.Close()
	}
	return d.acceptUntilQuit(ln)
}

// acceptUntilQuit serves connections one at a time until a quit command
// or SIGTERM/SIGINT.
func (d *daemon) acceptUntilQuit(ln net.Listener) error {
	quit := make(chan struct{})
	var once sync.Once
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		select {
		case s := <-signals:
			d.record(MPSEvent{Event: "exit", Reply: "signal " + s.String()})
			once.Do(func() { close(quit) })
			ln.Close()
		case <-quit:
		}
	}()
	for {
		conn, err := ln.Accept()
		if err != nil {
			select {
			case <-quit:
				return nil
			default:
				return err
			}
		}
		if d.serve(conn) {
			d.record(MPSEvent{Event: "exit", Reply: "quit"})
			once.Do(func() { close(quit) })
			return nil
		}
	}
}

// serve answers one connection's command; it reports whether it was quit.
func (d *daemon) serve(conn net.Conn) (quit bool) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil && line == "" {
		return false
	}
	command := strings.TrimSpace(line)
	reply, cmdErr := d.do(command)
	e := MPSEvent{Event: "command", Command: command, Reply: reply}
	status := "OK"
	if cmdErr != nil {
		status, e.Reply, e.Failed = "ERR", cmdErr.Error(), true
	}
	d.record(e)
	fmt.Fprintf(conn, "%s\n%s\n", status, e.Reply)
	return cmdErr == nil && command == "quit"
}

// do runs a command of the control daemon's interface.
func (d *daemon) do(command string) (string, error) {
	f := strings.Fields(command)
	if len(f) == 0 {
		return "", errors.New("empty command")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	args := f[1:]
	want := func(n int) error {
		if len(args) != n {
			return fmt.Errorf("%s takes %d arguments", f[0], n)
		}
		return nil
	}
	switch f[0] {
	case "get_server_list":
		return "", want(0) // the mock runs no MPS server
	case "quit":
		return "", want(0)
	case "get_default_active_thread_percentage":
		return strconv.FormatFloat(d.threads, 'f', 1, 64), want(0)
	case "set_default_active_thread_percentage":
		if err := want(1); err != nil {
			return "", err
		}
		v, err := strconv.ParseFloat(args[0], 64)
		if err != nil || v <= 0 || v > 100 {
			return "", fmt.Errorf("invalid active thread percentage %q: must be above 0 and at most 100", args[0])
		}
		d.threads = v
		return strconv.FormatFloat(v, 'f', 1, 64), nil
	case "get_default_device_pinned_mem_limit":
		if err := want(1); err != nil {
			return "", err
		}
		dev, err := d.device(args[0])
		if err != nil {
			return "", err
		}
		return d.pinned[dev], nil
	case "set_default_device_pinned_mem_limit":
		if err := want(2); err != nil {
			return "", err
		}
		dev, err := d.device(args[0])
		if err != nil {
			return "", err
		}
		if q, err := resource.ParseQuantity(args[1]); err != nil || q.Sign() <= 0 || !strings.HasSuffix(args[1], "M") && !strings.HasSuffix(args[1], "G") {
			return "", fmt.Errorf("invalid memory limit %q: want a size in M or G (\"4096M\")", args[1])
		}
		d.pinned[dev] = args[1]
		return "", nil
	}
	return "", fmt.Errorf("unknown command %q", f[0])
}

// device checks a device index against the visible devices.
func (d *daemon) device(arg string) (int, error) {
	i, err := strconv.Atoi(arg)
	if err != nil || i < 0 || len(d.devices) > 0 && i >= len(d.devices) {
		return 0, fmt.Errorf("invalid device %q: %d devices are visible", arg, len(d.devices))
	}
	return i, nil
}

func (d *daemon) record(e MPSEvent) {
	e.Time, e.PID = time.Now(), os.Getpid()
	data, _ := json.Marshal(e)
	_, _ = d.log.Write(append(data, '\n'))
}
