// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestRealGPUCheck runs hack/realgpu-check.sh, which someone with a real
// NVIDIA GPU runs, on mock hardware laid out as a CUDA image's driver
// (/usr/local/nvidia) with the suite's stand-in libcuda: every step
// passes, the emulated containers load libcuda through their claims' CDI
// edits, the MPS client gets its daemon and limits, the time-sliced claim
// is refused under gpus.settings: Leave, and nothing is left behind.
func TestRealGPUCheck(t *testing.T) {
	framework.SkipIfUnavailable(t)
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := checkBinaries(t, root)
	mockDir := filepath.Join(t.TempDir(), "hw")
	hardware := framework.MockProfile(t, "realgpu-check", cudaNode) // mock:<file>
	env := append(os.Environ(), persist.DirEnv+"="+mockDir, "HWDRA_CHECK_BIN="+bin,
		"HWDRA_CHECK_HARDWARE="+hardware, "HWDRA_CHECK_OUT="+t.TempDir())
	// The mock's driver root exists once the mock was opened; then its
	// libcuda becomes a library a program can load.
	probe := exec.Command(filepath.Join(bin, "hwdra"), "probe", "--hardware", hardware)
	probe.Env = env
	if out, err := probe.CombinedOutput(); err != nil {
		t.Fatalf("probe: %v: %s", err, out)
	}
	libs, _ := filepath.Glob(filepath.Join(mockDir, "host/usr/local/nvidia/lib64/libcuda.so.*.*"))
	if len(libs) != 1 {
		t.Fatalf("libcuda files %v", libs)
	}
	if err := framework.BuildStandInLibcuda(libs[0]); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(root, "hack", "realgpu-check.sh"))
	cmd.Dir, cmd.Env = root, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the check failed: %v\n%s", err, out)
	}
	summary := string(out)
	for _, want := range []string{
		"doctor                       ",
		"lab gpu-full                 OK    === CUDA /lib64/libcuda.so.1 cuInit=0 version=12040 hwdra-mock-libcuda",
		"lab gpu-share                OK    === CUDA /lib64/libcuda.so.1 cuInit=0",
		"lab gpu-mps                  OK    === CUDA /lib64/libcuda.so.1 cuInit=0 version=12040 hwdra-mock-libcuda;=== MPS pipe=/tmp/nvidia-mps control=yes threads=50 memory=0=16384M",
		"lab gpu-timeslicing          OK    refused: gpus.settings: Leave",
	} {
		if !strings.Contains(summary, want) {
			t.Errorf("the summary lacks %q", want)
		}
	}
	st, err := persist.ReadState(mockDir)
	if err != nil {
		t.Fatal(err)
	}
	if calls := persist.SettingCalls(st.Calls); len(calls) != 0 {
		t.Errorf("GPU setting calls under gpus.settings: Leave: %v", calls)
	}
	if len(st.GPUs) == 0 {
		t.Fatal("the mock's state names no GPU")
	}
	for _, g := range st.GPUs {
		if len(g.GPUInstances) != 0 || g.ComputeMode != 0 || g.TimeSlice != 0 {
			t.Errorf("GPU %s left changed: %+v", g.BusID, g)
		}
	}
	if t.Failed() {
		t.Log(summary)
	}
}

// checkBinaries are what the check runs: this run's hwdra, the agent
// image's nvidia-cdi-hook, cdirun and cudaapp built now.
func checkBinaries(t *testing.T, root string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(framework.HwdraBinary(t), filepath.Join(dir, "hwdra")); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][]string{
		{"go", "build", "-o", filepath.Join(dir, "cdirun"), "./hack/cdirun"},
		{"gcc", "-O2", "-o", filepath.Join(dir, "cudaapp"), "test/e2e/images/cudaapp/cudaapp.c"},
		{"go", "build", "-ldflags", "-s -w -linkmode external -extldflags -static", "-o", filepath.Join(dir, "nvidia-cdi-hook"),
			"github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"},
	} {
		cmd := exec.Command(c[0], c[1:]...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	return dir
}

// moduleRoot is the repository's root (go env GOMOD's folder).
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}
