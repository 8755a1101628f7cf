// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestImageBinary builds hwdra as the agent's image does
// (hack/build-image.sh: -tags nolab,nomock,grpcnotrace, no VCS stamp, the
// version from hack/version-ldflags.sh) and checks what it carries.
func TestImageBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	flags, err := exec.Command("../../hack/version-ldflags.sh").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "hwdra")
	build := exec.Command("go", "build", "-buildvcs=false", "-tags", "nolab,nomock,grpcnotrace", "-ldflags", strings.TrimSpace(string(flags)), "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	// Without Go's VCS stamp (a container without .git) it still says its
	// version and commit.
	t.Run("version", func(t *testing.T) {
		out, err := exec.Command(bin, "version").Output()
		if err != nil {
			t.Fatal(err)
		}
		if want := "commit: " + strings.TrimSpace(string(head)); !strings.Contains(string(out), want) {
			t.Errorf("hwdra version says\n%s\nwant %q", out, want)
		}
		if !strings.HasPrefix(string(out), "hwdra 0.") {
			t.Errorf("no chart version: %s", out)
		}
	})

	// The agent on customers' nodes carries no hardware simulator: no
	// symbol of it, no mock hardware, no `hwdra mock`.
	t.Run("no simulator", func(t *testing.T) {
		syms, err := exec.Command("go", "tool", "nm", bin).Output()
		if err != nil {
			t.Fatal(err)
		}
		var agent, sim int
		for line := range strings.Lines(string(syms)) {
			switch {
			case strings.Contains(line, "github.com/hwdra/hwdra/internal/mock"):
				sim++
			case strings.Contains(line, "github.com/hwdra/hwdra/internal/agent."):
				agent++
			}
		}
		if sim > 0 || agent == 0 {
			t.Errorf("symbols: %d of the simulator (want none), %d of the agent", sim, agent)
		}
		out, err := exec.Command(bin, "probe", "--hardware", "mock:dgx-h100").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "without the hardware simulator") {
			t.Errorf("hwdra probe --hardware mock:dgx-h100 in the image: %v\n%s", err, out)
		}
		if out, err := exec.Command(bin, "mock", "inject", "--help").CombinedOutput(); err == nil {
			t.Errorf("hwdra mock in the image: %s", out)
		}
	})
}
