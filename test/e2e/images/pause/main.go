// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Command pause is the sandbox ("pause") image of the real-node tests: it
// holds the pod's namespaces, reaps orphans (it may be PID 1 of the pod's PID
// namespace) and exits cleanly on SIGTERM or SIGINT. There is no registry on
// the test machines, so the harness builds this into a local OCI image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child so none stays a zombie.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
