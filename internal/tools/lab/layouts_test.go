// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/mock/profile"
)

// TestSharingOnEveryDriverLayout: the sharing examples (a GPU share, an
// MPS claim, a time-sliced claim) prepare for real on a node whose driver
// is installed in each root and layout real nodes use: the agent finds
// the driver's programs there (the MPS control daemon, nvidia-smi) as on
// a host, and everything is undone.
func TestSharingOnEveryDriverLayout(t *testing.T) {
	var roots []string
	for r := range profile.DriverRoots {
		roots = append(roots, r)
	}
	slices.Sort(roots)
	for _, root := range roots {
		t.Run(root, func(t *testing.T) {
			var out bytes.Buffer
			err := Run(context.Background(), &out, Options{
				Hardware:   "mock:" + writeLabProfile(t, "gpus: [{model: h100-80gb, count: 3}]\ndriver: {root: "+root+"}\n"),
				ClaimFiles: examples("gpu-share.yaml", "gpu-mps.yaml", "gpu-timeslicing.yaml"),
			})
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			got := out.String()
			wantOutput(t, got,
				"NVIDIA driver root "+root+" (",
				"MPS control daemon ",
				"gpu-share: unprepared", "gpu-mps: unprepared", "gpu-timeslicing: unprepared",
				"no MPS control daemons",
			)
			if t.Failed() {
				t.Log(got)
			}
		})
	}
}

// TestDriverWithoutPrograms: on a node whose driver installation has NVML
// but not its programs, whole GPUs still prepare, and an MPS claim fails
// with an error that names what is missing and where it was looked for;
// nothing is left behind.
func TestDriverWithoutPrograms(t *testing.T) {
	var out bytes.Buffer
	hardware := "mock:" + writeLabProfile(t, "gpus: [{model: h100-80gb, count: 2}]\ndriver: {root: /usr/local/nvidia, noPrograms: true}\n")
	if err := Run(context.Background(), &out, Options{Hardware: hardware, ClaimFiles: examples("gpu-full.yaml")}); err != nil {
		t.Fatalf("a whole GPU: %v\n%s", err, out.String())
	}
	out.Reset()
	err := Run(context.Background(), &out, Options{Hardware: hardware, ClaimFiles: examples("gpu-mps.yaml")})
	if err == nil || !strings.Contains(err.Error(), "nvidia-cuda-mps-control is not at ") || !strings.Contains(err.Error(), "/usr/local/nvidia/bin/") || !strings.Contains(err.Error(), "lacks its programs") {
		t.Fatalf("an MPS claim without the driver's programs: %v\n%s", err, out.String())
	}
}

func writeLabProfile(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "profile.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
