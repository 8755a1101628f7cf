// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package driverlibs

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/mock"
	"github.com/hwdra/hwdra/internal/mock/drivertools"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
	"github.com/hwdra/hwdra/internal/mock/profile"
)

const hook = "/var/lib/hwdra/bin/nvidia-cdi-hook"

// node opens a mock node with its driver installed under root.
func node(t *testing.T, root string) *mock.Hardware {
	t.Helper()
	h := mocktest.Open(t, "gpus: [{model: h100-80gb, count: 1}]\ndriver: {root: "+root+"}\n")
	if ret := h.NVML.Init(); ret != gonvml.SUCCESS {
		t.Fatal(ret)
	}
	t.Cleanup(func() { h.NVML.Shutdown() })
	return h
}

func options(h *mock.Hardware) Options {
	return Options{Root: h.DriverRoot(), DevRoot: h.Dir(), NVML: h.NVML, HookPath: hook}
}

// versioned is an NVML that reports another driver version.
type versioned struct {
	gonvml.Interface
	version string
}

func (v versioned) SystemGetDriverVersion() (string, gonvml.Return) { return v.version, gonvml.SUCCESS }

// bufferedLog is a test logger whose output the test can read.
func bufferedLog(t *testing.T) (klog.Logger, context.Context) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	return logger, klog.NewContext(context.Background(), logger)
}

func hookArgs(e *cdispec.ContainerEdits) []string {
	var out []string
	for _, h := range e.Hooks {
		out = append(out, strings.Join(h.Args, " "))
	}
	return out
}

// TestGeneratedOnEveryLayout: on each root and layout real nodes use,
// containers get every library of the running driver's version and the
// driver's programs from where they are, at the paths they have under the
// root, with the hooks that link their sonames and update the container's
// ld cache over the folder they are in.
func TestGeneratedOnEveryLayout(t *testing.T) {
	for root, layout := range profile.DriverRoots {
		t.Run(root, func(t *testing.T) {
			h := node(t, root)
			_, ctx := ktesting.NewTestContext(t)
			e, src := New(options(h)).Edits(ctx)
			if src != SourceGenerated || e == nil {
				t.Fatalf("source %q, edits %v", src, e)
			}
			libDir := "/" + layout.Lib
			var libs []string
			for _, m := range e.Mounts {
				if _, err := os.Stat(m.HostPath); err != nil && m.HostPath != "/dev/null" {
					t.Errorf("mount of a path the node lacks: %v", err)
				}
				if rel, ok := strings.CutPrefix(m.HostPath, h.DriverRoot()); ok && rel != m.ContainerPath {
					t.Errorf("%s mounted at %s, want its path under the root, %s", m.HostPath, m.ContainerPath, rel)
				}
				if filepath.Dir(m.ContainerPath) == libDir {
					libs = append(libs, filepath.Base(m.ContainerPath))
				}
			}
			for _, soname := range drivertools.Libraries {
				base := soname[:strings.Index(soname, ".so")+len(".so")]
				if !slices.Contains(libs, base+"."+h.DriverVersion()) {
					t.Errorf("no %s.%s among the libraries %v", base, h.DriverVersion(), libs)
				}
			}
			for _, p := range []string{drivertools.SMI, drivertools.MPSControl} {
				want := "/" + filepath.Join(layout.Bin, p)
				if !slices.ContainsFunc(e.Mounts, func(m *cdispec.Mount) bool { return m.ContainerPath == want }) {
					t.Errorf("no %s", want)
				}
			}
			args := hookArgs(e)
			for _, want := range []string{"nvidia-cdi-hook update-ldcache --folder " + libDir, "nvidia-cdi-hook create-symlinks --link libcuda.so.1::" + libDir + "/libcuda.so"} {
				if !slices.Contains(args, want) {
					t.Errorf("no hook %q among %v", want, args)
				}
			}
			for _, h := range e.Hooks {
				if h.Path != hook {
					t.Errorf("hook %v runs %s, want %s", h.Args, h.Path, hook)
				}
			}
		})
	}
}

// TestGeneratedOncePerVersion: the edits are generated once per driver
// version, not per prepare, and again when the version changes (a driver
// upgrade); host paths are as the container runtime names them.
func TestGeneratedOncePerVersion(t *testing.T) {
	h := node(t, "/usr/local/nvidia")
	_, ctx := ktesting.NewTestContext(t)
	nv := &versioned{Interface: h.NVML, version: h.DriverVersion()}
	opts := options(h)
	opts.NVML, opts.NodeRoot = nv, "/usr/local/nvidia"
	l := New(opts)
	first, _ := l.Edits(ctx)
	again, _ := l.Edits(ctx)
	if first == nil || first != again {
		t.Fatalf("a second look generated again (%p, %p)", first, again)
	}
	for _, m := range first.Mounts {
		if m.HostPath != "/dev/null" && !strings.HasPrefix(m.HostPath, "/usr/local/nvidia/") {
			t.Errorf("host path %s is not as the node names it", m.HostPath)
		}
	}
	// An upgrade to a version whose libraries the root has.
	other := "580.159.04"
	if err := drivertools.InstallLibraries(filepath.Join(h.DriverRoot(), "lib64"), other); err != nil {
		t.Fatal(err)
	}
	nv.version = other
	upgraded, src := l.Edits(ctx)
	if src != SourceGenerated || upgraded == first || !slices.ContainsFunc(upgraded.Mounts, func(m *cdispec.Mount) bool {
		return strings.HasSuffix(m.HostPath, "libcuda.so."+other)
	}) {
		t.Fatalf("after the upgrade: %s, %+v", src, upgraded)
	}
}

// TestPartialInstallation: a driver root without the libraries of the
// running driver's version (a root of another driver, a broken install)
// gives containers nothing, and says why, naming the root and the
// version; nothing is generated again until the version changes.
func TestPartialInstallation(t *testing.T) {
	h := node(t, "/")
	logger, ctx := bufferedLog(t)
	opts := options(h)
	opts.NVML = versioned{Interface: h.NVML, version: "999.1.2"}
	l := New(opts)
	for range 2 {
		if e, src := l.Edits(ctx); e != nil || src != SourceNone {
			t.Fatalf("edits from libraries of another version: %s %+v", src, e)
		}
	}
	if d := l.Decide(ctx); d.Err == nil || d.Source != SourceNone || d.DriverVersion != "999.1.2" {
		t.Errorf("decided: %+v", d)
	}
	log := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if n := strings.Count(log, "could not be generated"); n != 1 || !strings.Contains(log, "999.1.2") || !strings.Contains(log, h.DriverRoot()) {
		t.Errorf("said %d times, or without the version and root:\n%s", n, log)
	}
}

// TestToolkitSpec: the toolkit's spec of the running driver wins over the
// generated edits; a stale one (another driver version) and an unreadable
// one lose to them, and the log says so; without NVML nothing is
// generated and only a spec gives files.
func TestToolkitSpec(t *testing.T) {
	h := node(t, "/")
	logger, ctx := bufferedLog(t)
	dir := t.TempDir()
	opts := options(h)
	opts.SpecDirs = []string{dir}
	l := New(opts)
	write := func(version string) {
		spec := "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [{name: all, containerEdits: {env: [A=1]}}]\ncontainerEdits:\n  mounts:\n" +
			"  - {hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so." + version + ", containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so." + version + "}\n"
		if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(h.DriverVersion())
	if e, src := l.Edits(ctx); src != SourceToolkit || len(e.Mounts) != 1 {
		t.Fatalf("current toolkit spec: %s %+v", src, e)
	}
	write("535.1.1") // the same size: the modification time tells
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(filepath.Join(dir, "nvidia.yaml"), later, later); err != nil {
		t.Fatal(err)
	}
	if e, src := l.Edits(ctx); src != SourceGenerated || len(e.Mounts) < 2 {
		t.Fatalf("stale toolkit spec: %s %+v", src, e)
	}
	if d := l.Decide(ctx); !d.Stale || d.Toolkit != filepath.Join(dir, "nvidia.yaml") || d.ToolkitVersion != "535.1.1" ||
		d.DriverVersion != h.DriverVersion() || d.Source != SourceGenerated || d.Err != nil || len(d.Unreadable) != 0 {
		t.Errorf("stale toolkit spec, decided: %+v", d)
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte("kind: [nope"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, src := l.Edits(ctx); src != SourceGenerated {
		t.Fatalf("unreadable toolkit spec: %s", src)
	}
	if d := l.Decide(ctx); d.Toolkit != "" || d.Stale || len(d.Unreadable) != 1 || !strings.HasPrefix(d.Unreadable[0], filepath.Join(dir, "nvidia.yaml")+": ") {
		t.Errorf("unreadable toolkit spec, decided: %+v", d)
	}
	log := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	for _, want := range []string{"from the NVIDIA Container Toolkit's spec", "is of another driver version", "535.1.1", "Unreadable CDI spec"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q:\n%s", want, log)
		}
	}
	write(h.DriverVersion())
	opts.NVML = nil
	if _, src := New(opts).Edits(ctx); src != SourceToolkit {
		t.Errorf("without NVML, a toolkit spec: %s", src)
	}
	opts.SpecDirs = nil
	if e, src := New(opts).Edits(ctx); src != SourceNone || e != nil {
		t.Errorf("without NVML or spec: %s %+v", src, e)
	}
}

// TestWithoutHook: without nvidia-cdi-hook the libraries are still given,
// with no hook that could not run, and the log says what containers lack.
func TestWithoutHook(t *testing.T) {
	h := node(t, "/")
	logger, ctx := bufferedLog(t)
	opts := options(h)
	opts.HookPath = ""
	e, src := New(opts).Edits(ctx)
	if src != SourceGenerated || len(e.Hooks) != 0 || !mountsLibrary(e.Mounts, "libcuda.so.") {
		t.Fatalf("%s %+v", src, e)
	}
	if log := logger.GetSink().(ktesting.Underlier).GetBuffer().String(); !strings.Contains(log, "no nvidia-cdi-hook") {
		t.Errorf("log:\n%s", log)
	}
}

// TestInstallHook: the shipped hook is installed executable, kept while
// equal and replaced when it changes (a new agent's image).
func TestInstallHook(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bin")
	path, err := installHook(dir, []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o755 || path != filepath.Join(dir, HookProgram) {
		t.Fatalf("installed %s: %v %v", path, st, err)
	}
	before := st.ModTime()
	if _, err := installHook(dir, []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(path); !st.ModTime().Equal(before) {
		t.Error("an equal hook was written again")
	}
	if _, err := installHook(dir, []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "v2" {
		t.Errorf("the hook is %q after an update", got)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("left beside it: %v", entries)
	}
	// Nothing ships beside a test binary.
	if path, err := InstallHook(dir); path != "" || err != nil {
		t.Errorf("InstallHook from a build: %q, %v", path, err)
	}
}
