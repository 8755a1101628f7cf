// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package procstat reads what the agent needs of /proc/<pid>/stat: a
// process's state and start time, which with its PID say which process it
// is (a PID is reused, a PID and start time are not).
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrExited: the process is a zombie (or dead); its GPU contexts, its
// server, all that it held is gone.
var ErrExited = errors.New("process has exited")

// Parse reads the state (field 3) and start time (field 22, clock ticks
// after boot) of a stat file's contents. The command (field 2) is in
// parentheses and may hold spaces and parentheses itself, so fields are
// counted after its last ')'.
func Parse(b []byte) (state byte, start uint64, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("no command field")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("%d fields after the command, want at least 20", len(f))
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return f[0][0], start, err
}

// StartTime is a running process's start time; an error wrapping
// ErrExited for a zombie, os.ErrNotExist for a PID that is gone.
func StartTime(pid int) (uint64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	state, start, err := Parse(data)
	if err != nil {
		return 0, fmt.Errorf("process %d: unreadable stat: %w", pid, err)
	}
	if state == 'Z' || state == 'X' {
		return 0, fmt.Errorf("process %d: %w", pid, ErrExited)
	}
	return start, nil
}
