// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/backend/driverlibs"
)

// TestGeneratedDriverFiles: without the toolkit's spec a whole GPU's
// container gets the driver's files generated from the mock's driver
// root: libcuda of the driver's version from where it is on the node, and
// the hooks that link its soname and update the ld cache, run from the
// node's nvidia-cdi-hook.
func TestGeneratedDriverFiles(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]\ndriver: {root: /usr/local/nvidia}\n", false)
	const hook = "/var/lib/hwdra/bin/nvidia-cdi-hook"
	e.driver.files = driverlibs.New(driverlibs.Options{Root: e.hw.DriverRoot(), DevRoot: e.hw.Dir(), NVML: e.nvml.Library(), HookPath: hook})
	spec := e.inject(e.mustPrepare(e.claim(request{name: "gpu", cel: `profile == "full"`})))
	lib := "/lib64/libcuda.so." + e.hw.DriverVersion()
	i := slices.IndexFunc(spec.Mounts, func(m oci.Mount) bool { return m.Destination == lib })
	if i < 0 {
		t.Fatalf("no %s among the mounts %v", lib, spec.Mounts)
	}
	if src := spec.Mounts[i].Source; src != filepath.Join(e.hw.DriverRoot(), lib) {
		t.Errorf("%s from %s", lib, src)
	} else if _, err := os.Stat(src); err != nil {
		t.Error(err)
	}
	if spec.Hooks == nil || !slices.ContainsFunc(spec.Hooks.CreateContainer, func(h oci.Hook) bool {
		return h.Path == hook && strings.Join(h.Args, " ") == "nvidia-cdi-hook update-ldcache --folder /lib64"
	}) {
		t.Errorf("no ld cache hook from %s: %+v", hook, spec.Hooks)
	}
}

// TestDriverFilesDoNotCoverTheClaims: a toolkit spec generated while an
// MPS daemon ran on the host mounts the host's /tmp/nvidia-mps; an MPS
// claim's container still gets its own daemon's pipe directory there (the
// claim's MPS edits come after the device's, and CDI keeps one mount per
// destination, the last).
func TestDriverFilesDoNotCoverTheClaims(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", false)
	dir := filepath.Join(e.dir, "etc-cdi")
	os.MkdirAll(dir, 0o755)
	spec := "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [{name: all, containerEdits: {env: [A=1]}}]\ncontainerEdits:\n  mounts:\n" +
		"  - {hostPath: /tmp/nvidia-mps, containerPath: /tmp/nvidia-mps}\n  - {hostPath: /usr/lib/libcuda.so.1, containerPath: /usr/lib/libcuda.so.1}\n"
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := sharingConfig(`{"strategy": "MPS"}`)
	c := e.claim(request{name: "gpu", cel: `profile == "full"`, config: cfg})
	devs := e.mustPrepare(c)
	defer e.unprepare(c)
	pipe := e.driver.MPS().Dirs(e.onlyDaemon()).Pipe
	var sources []string
	for _, m := range e.inject(devs).Mounts {
		if m.Destination == mps.ContainerPipeDir {
			sources = append(sources, m.Source)
		}
	}
	if !slices.Equal(sources, []string{pipe}) {
		t.Errorf("%s mounted from %v, want only the claim's daemon's %s", mps.ContainerPipeDir, sources, pipe)
	}
}
