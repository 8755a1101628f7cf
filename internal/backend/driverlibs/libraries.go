// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package driverlibs gives GPU containers the NVIDIA driver's files: the
// user-space libraries of exactly the node's driver version (libcuda,
// libnvidia-ml, the PTX JIT compiler, ...), the driver's programs, and the
// hooks that make the dynamic linker find the libraries in any image.
// They come from the NVIDIA Container Toolkit's node-wide CDI spec where
// one exists and is of the running driver, else they are generated with
// NVIDIA's own nvcdi from the driver root, once per driver version.
//
// Why the toolkit's spec wins when it is current: the operator installed
// the toolkit and keeps it (its hook path, its feature flags, refreshed on
// driver upgrades by nvidia-cdi-refresh), and the runtime may use the same
// spec for other containers; a spec of another driver version (stale) or
// an unreadable one loses to the generated edits, and the log says so.
package driverlibs

import (
	"context"
	"fmt"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Options say where the driver is and how containers run its hooks.
type Options struct {
	// Root is the driver's root as this process sees it (a mount of the
	// node's / or of the driver root in the DaemonSet); NodeRoot the same
	// folder as the container runtime sees it (empty: Root).
	Root, NodeRoot string
	// DevRoot is the folder whose dev/ holds the GPUs' device nodes, as
	// this process sees it.
	DevRoot string
	// NVML is the initialised NVML library; nil: nothing is generated (a
	// node whose GPUs are all bound to vfio-pci has no driver to give).
	NVML gonvml.Interface
	// SpecDirs are searched for the toolkit's spec, the last one's first.
	SpecDirs []string
	// HookPath is nvidia-cdi-hook on the node, for the generated edits'
	// hooks; empty: generated edits have no hooks (the libraries are
	// mounted but get no soname links and no ld cache entry).
	HookPath string
}

// Source says where containers' driver files come from.
type Source string

const (
	// SourceNone: no files (no driver to read, or none found).
	SourceNone Source = ""
	// SourceToolkit: the NVIDIA Container Toolkit's node-wide spec.
	SourceToolkit Source = "toolkit"
	// SourceGenerated: generated from the driver root with nvcdi.
	SourceGenerated Source = "generated"
)

// Libraries gives containers the driver's files.
type Libraries struct {
	opts Options

	mu      sync.Mutex
	toolkit toolkitSpecs
	// gen is the generated edits of version (nil with err where that
	// failed: a failure is not retried until the version changes).
	gen struct {
		version string
		edits   *cdispec.ContainerEdits
		err     error
	}
	// said is the last thing logged about where the files come from, so
	// that each change is said once.
	said string
}

// New returns Libraries over a driver installation. It reads nothing yet.
func New(opts Options) *Libraries {
	return &Libraries{opts: opts, toolkit: toolkitSpecs{dirs: opts.SpecDirs}}
}

// Edits are the container edits every GPU container gets (nil where
// there are none) and where they come from. Each call looks at the
// toolkit's spec (a directory listing) and asks NVML for the driver
// version; it generates only when the version changed.
func (l *Libraries) Edits(ctx context.Context) (*cdispec.ContainerEdits, Source) {
	d := l.Decide(ctx)
	return d.Edits, d.Source
}

// Decision is what Edits decided and why: for the agent's log and for
// `hwdra doctor`.
type Decision struct {
	// Source and Edits are what Edits returns.
	Source Source
	Edits  *cdispec.ContainerEdits
	// DriverVersion is the running driver's, as NVML tells it; "" where
	// it cannot.
	DriverVersion string
	// Toolkit is the toolkit's spec file found ("" none) and
	// ToolkitVersion the driver version of the libraries it mounts ("" where
	// none is named with a version); Stale: of another driver version than
	// the running one, so passed over.
	Toolkit, ToolkitVersion string
	Stale                   bool
	// Unreadable are the spec files that could not be read, each "file:
	// why": passed over.
	Unreadable []string
	// Err is why the files could not be generated (Source is then
	// SourceNone).
	Err error
}

// Decide is Edits with the reasons: it decides as Edits does, logs the
// same, and says why.
func (l *Libraries) Decide(ctx context.Context) Decision {
	logger := klog.FromContext(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	d := Decision{DriverVersion: l.driverVersion()}
	version := d.DriverVersion
	var spec *cdi.Spec
	spec, d.Unreadable = l.toolkit.find(logger)
	if spec != nil {
		v := specVersion(spec)
		d.Toolkit, d.ToolkitVersion = spec.GetPath(), v
		if v == "" || version == "" || v == version {
			l.say(logger, "Containers get the NVIDIA driver's files from the NVIDIA Container Toolkit's spec", "file", spec.GetPath(), "driverVersion", version)
			e := spec.ContainerEdits
			d.Source, d.Edits = SourceToolkit, &e
			return d
		}
		d.Stale = true
		l.say(logger, "Warning: the NVIDIA Container Toolkit's spec is of another driver version (stale: nvidia-ctk cdi generate refreshes it); containers get the files generated for the running driver instead",
			"file", spec.GetPath(), "specVersion", v, "driverVersion", version)
	}
	if version == "" {
		if l.opts.NVML != nil {
			l.say(logger, "Warning: NVML does not tell the driver version: containers get GPU device nodes but no driver files")
		}
		return d
	}
	if l.gen.version != version {
		l.gen.version = version
		l.gen.edits, l.gen.err = l.generate(logger)
	}
	if d.Err = l.gen.err; d.Err != nil {
		l.say(logger, "Warning: the NVIDIA driver's files for containers could not be generated: containers get GPU device nodes but no driver libraries (CUDA programs will not start); install the driver's libraries of the running version under the driver root, or the NVIDIA Container Toolkit's spec (nvidia-ctk cdi generate)",
			"err", l.gen.err.Error(), "driverRoot", l.nodeRoot(), "driverVersion", version)
		return d
	}
	if l.opts.HookPath == "" {
		l.say(logger, "Warning: containers get the NVIDIA driver's files generated from the driver root, but no nvidia-cdi-hook to link their sonames and update the ld cache: programs that load libcuda.so.1 will not find it",
			"driverRoot", l.nodeRoot(), "driverVersion", version, "mounts", len(l.gen.edits.Mounts))
	} else {
		l.say(logger, "Containers get the NVIDIA driver's files generated from the driver root",
			"driverRoot", l.nodeRoot(), "driverVersion", version, "mounts", len(l.gen.edits.Mounts), "hook", l.opts.HookPath)
	}
	d.Source, d.Edits = SourceGenerated, l.gen.edits
	return d
}

// driverVersion is the running driver's version, "" where NVML cannot
// tell.
func (l *Libraries) driverVersion() string {
	if l.opts.NVML == nil {
		return ""
	}
	v, ret := l.opts.NVML.SystemGetDriverVersion()
	if ret != gonvml.SUCCESS {
		return ""
	}
	return v
}

// say logs msg when it differs from the last thing said (l.mu held).
func (l *Libraries) say(logger klog.Logger, msg string, kv ...any) {
	key := msg
	for _, v := range kv {
		key += "|" + fmt.Sprint(v)
	}
	if key == l.said {
		return
	}
	l.said = key
	logger.Info(msg, kv...)
}
