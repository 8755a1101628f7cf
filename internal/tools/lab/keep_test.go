// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/hwdra/hwdra/internal/mock/persist"
)

// undoCommand is the directory of the command a kept run prints.
func undoCommand(t *testing.T, out string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^Undo it with: hwdra lab undo (\S+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the output names no undo command:\n%s", out)
	}
	return m[1]
}

// TestLabUndoAfterKeepWithTheMockGone: --keep on mock hardware that ends
// with the run leaves an MPS daemon running (its hardware gone), named
// with its PID; the command the run prints ends it and removes the run's
// temporary directory.
func TestLabUndoAfterKeepWithTheMockGone(t *testing.T) {
	t.Setenv(persist.DirEnv, "")
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Cleanup(func() {
		for _, pid := range mpsDaemons(tmp) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	var out bytes.Buffer
	if err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", Keep: true, ClaimFiles: examples("gpu-mps.yaml")}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	dir := undoCommand(t, out.String())
	daemons := mpsDaemons(tmp)
	if len(daemons) != 1 {
		t.Fatalf("MPS daemons %v running after --keep, want the claim's one", daemons)
	}
	if !regexp.MustCompile(`MPS control daemon \S+ \(PID [1-9][0-9]*\) for claim`).MatchString(out.String()) {
		t.Errorf("the output names no daemon's PID:\n%s", out.String())
	}
	out.Reset()
	if err := Undo(context.Background(), &out, dir); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	wantOutput(t, out.String(), "== Undo: the run's mock hardware is gone; ending its MPS daemons ==\n", "(PID ", "): ended\n", "undone\n")
	if left := mpsDaemons(tmp); len(left) > 0 {
		t.Errorf("MPS daemons %v still run after the undo", left)
	}
	if left, _ := os.ReadDir(tmp); len(left) > 0 {
		t.Errorf("the undo left %v", left)
	}
	if err := Undo(context.Background(), &out, dir); err == nil || !strings.Contains(err.Error(), "not what a lab run left") {
		t.Errorf("a second undo: %v", err)
	}
}

// TestLabUndoAfterKeep: --keep on hardware that outlives the run (as a
// host's: persist.DirEnv) leaves MIG instances and an MPS daemon; the
// printed command unprepares them as the run would have, on a later
// process's view of the hardware.
func TestLabUndoAfterKeep(t *testing.T) {
	d := persistentMock(t, "dgx-h100", nil)
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", Keep: true, StateDir: d.state, CDIDir: d.cdi,
		ClaimFiles: examples("gpu-mps.yaml", "mig-1g.10gb.yaml", "gpu-timeslicing.yaml")})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	dir := undoCommand(t, out.String())
	if len(mpsDaemons(d.state)) == 0 {
		t.Fatal("no MPS daemon kept")
	}
	out.Reset()
	if err := Undo(context.Background(), &out, dir); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	wantOutput(t, withoutLogs(out.String()), "gpu-mps: unprepared (gpu.hwdra.io)\n", "mig-1g-10gb: unprepared (gpu.hwdra.io)\n", "undone\n")
	checkNothingLeft(t, d)
	if _, err := os.Stat(filepath.Join(d.state, keptFile)); err == nil {
		t.Errorf("%s left", keptFile)
	}
	if t.Failed() {
		t.Log(out.String())
	}
}

// TestLabReportsARestoreFailure: a GPU whose time slice cannot be set
// back (nvidia-smi gone while the claim was prepared) is named in the
// summary with the setting it had, and the run fails, although every
// claim unprepared.
func TestLabReportsARestoreFailure(t *testing.T) {
	d := persistentMock(t, "dgx-h100", nil)
	var smi []string
	_ = filepath.WalkDir(d.mock, func(path string, e os.DirEntry, err error) error {
		if err == nil && e.Name() == "nvidia-smi" && !e.IsDir() {
			smi = append(smi, path)
		}
		return nil
	})
	if len(smi) == 0 {
		t.Fatalf("no nvidia-smi in the mock hardware's directory %s", d.mock)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	var out bytes.Buffer
	err = Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", StateDir: d.state, CDIDir: d.cdi,
		ClaimFiles: examples("gpu-timeslicing.yaml"), Exec: []string{sh, "-c", `for f in "$@"; do mv "$f" "$f.gone"; done`, "sh", smi[0]}})
	got := withoutLogs(out.String())
	wantOutput(t, got, "gpu-timeslicing: unprepared (gpu.hwdra.io)\n", "left changed on the hardware (the log above says why):\n  GPU ")
	if !regexp.MustCompile(`(?m)^  GPU \S+: settings not restored \(was .*time slice 0\)$`).MatchString(got) {
		t.Errorf("the summary names no GPU with the setting it had:\n%s", got)
	}
	if err == nil || !strings.Contains(err.Error(), "left changed on the hardware: GPU ") {
		t.Errorf("error %v, want the GPU left changed", err)
	}
	if t.Failed() {
		t.Log(out.String())
	}
}
