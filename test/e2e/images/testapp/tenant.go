// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// With TESTAPP_TENANT ("action:path[=value];..."), the app first acts as a
// hostile tenant would on what its container has mounted, in order, and
// prints one line for each:
//
//	=== TENANT <action> <path>: <result>
//
// Actions:
//
//	write:P=V   write V into file P
//	keep:P=V    write V into P now and again whenever it says anything
//	            else, as long as the app runs
//	remove:P    remove P
//	fill:P      write zeros into P until a write fails; the result says
//	            how many bytes went in and why it stopped
//	exec:P      copy the app to P and run it (it exits at once)
//	mount:P     the mount at P: "<fstype> <options> size=<bytes>"
const tenantEnv = "TESTAPP_TENANT"

// exitNowEnv makes the app exit at once (exec:P's copy).
const exitNowEnv = "TESTAPP_EXIT_NOW"

// tenant runs the actions of spec.
func tenant(w io.Writer, spec string) {
	for _, a := range strings.Split(spec, ";") {
		action, target, ok := strings.Cut(a, ":")
		if !ok {
			continue
		}
		path, value, _ := strings.Cut(target, "=")
		fmt.Fprintf(w, "=== TENANT %s %s: %s\n", action, path, act(action, path, value))
	}
}

func act(action, path, value string) string {
	var err error
	switch action {
	case "write":
		err = os.WriteFile(path, []byte(value), 0o644)
	case "keep":
		err = os.WriteFile(path, []byte(value), 0o644)
		go keep(path, value)
	case "remove":
		err = os.Remove(path)
	case "fill":
		return fill(path)
	case "exec":
		err = runCopy(path)
	case "mount":
		return mountOf(path)
	default:
		return "unknown action"
	}
	if err != nil {
		return err.Error()
	}
	return "ok"
}

// keep rewrites path with value whenever it says anything else.
func keep(path, value string) {
	for {
		if got, err := os.ReadFile(path); err != nil || string(got) != value {
			_ = os.WriteFile(path, []byte(value), 0o644)
		}
		time.Sleep(time.Millisecond)
	}
}

func fill(path string) string {
	f, err := os.Create(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for {
		k, err := f.Write(buf)
		n += int64(k)
		if err != nil {
			return fmt.Sprintf("wrote %d: %v", n, err)
		}
		if n > 64<<30 {
			return fmt.Sprintf("wrote %d: no limit", n)
		}
	}
}

// runCopy copies this program to path and runs the copy.
func runCopy(path string) error {
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, self, 0o755); err != nil {
		return err
	}
	cmd := exec.Command(path)
	cmd.Env = []string{exitNowEnv + "=1"}
	return cmd.Run()
}

// mountOf is the mount at path, from /proc/self/mountinfo, and its size.
func mountOf(path string) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	found := "not a mount point"
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, _ := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if len(fields) >= 6 && len(tail) >= 1 && fields[4] == path {
			found = tail[0] + " " + fields[5] // the last mount on path is the one seen
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return found + " " + err.Error()
	}
	return fmt.Sprintf("%s size=%d", found, int64(st.Blocks)*st.Bsize)
}
