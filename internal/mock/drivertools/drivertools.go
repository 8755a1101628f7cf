// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package drivertools holds the mock's stand-ins for the NVIDIA driver's
// programs that the agent runs from the driver root:
// nvidia-cuda-mps-control (the MPS control daemon and its client) and
// nvidia-smi (compute-policy --set-timeslice). They take the real
// programs' command lines and control interface and record what they were
// told, so tests assert on what a real daemon would have been asked.
//
// The stand-ins are the binary that opened the mock, started again under
// the program's name: Install links the names to it in the mock's driver
// root, and a binary that links this package runs the stand-in instead of
// its main when started under one of them (init below). So the agent, a
// test binary or the agent's image need nothing built or installed
// besides themselves, and a stand-in is always of the same build as the
// mock it talks to.
package drivertools

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// The programs' names, as the driver installs them (in usr/bin or bin of
// its root).
const (
	MPSControl = "nvidia-cuda-mps-control"
	SMI        = "nvidia-smi"
)

func init() {
	var run func(args []string) int
	switch filepath.Base(os.Args[0]) {
	case MPSControl:
		run = mpsControl
	case SMI:
		run = smi
	default:
		return
	}
	os.Exit(run(os.Args[1:]))
}

// Install links the stand-ins into bin: symlinks to this executable,
// whose init runs them. With shared (a mock other processes and the
// container runtime use: persist.DirEnv) the links point at a copy of it
// in bin, so that they resolve wherever bin is seen (a runtime mounting
// the driver's programs into a container resolves them on the node, where
// an agent pod's own executable is not).
func Install(bin string, shared bool) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("mock driver tools: %w", err)
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	target := self
	if shared {
		if err := copyFile(self, filepath.Join(bin, sharedCopy)); err != nil {
			return fmt.Errorf("mock driver tools: %w", err)
		}
		target = sharedCopy // relative: beside the links
	}
	var errs []error
	for _, name := range []string{MPSControl, SMI} {
		link := filepath.Join(bin, name)
		if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, os.Symlink(target, link))
	}
	return errors.Join(errs...)
}

// sharedCopy is the copy of the executable the stand-ins of a shared mock
// run.
const sharedCopy = ".hwdra-driver-tools"

// copyFile copies an executable atomically (a stand-in of an earlier
// process may be running the old copy).
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), filepath.Base(dst)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, cerr := io.Copy(tmp, in)
	if err := errors.Join(cerr, tmp.Chmod(0o755), tmp.Close()); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

// Libraries are the driver's user-space libraries the mock stands in for,
// by soname: what a CUDA or NVML program in a container loads (the CUDA
// driver, NVML, the PTX JIT compiler and NVVM, the debugger, OpenCL, the
// allocator, the config library and the shader compiler).
var Libraries = []string{
	"libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4",
	"libcudadebugger.so.1", "libnvidia-opencl.so.1", "libnvidia-allocator.so.1", "libnvidia-cfg.so.1",
	"libnvidia-gpucomp.so",
}

// InstallLibraries writes a stand-in file for each of Libraries into lib,
// named as the driver names its files (libcuda.so.<version>) with the
// soname a symlink to it (libcuda.so.1 -> libcuda.so.<version>), as the
// driver's installer leaves them. A file already there is kept (a test
// may have put a real stand-in library there).
func InstallLibraries(lib, version string) error {
	if err := os.MkdirAll(lib, 0o755); err != nil {
		return err
	}
	var errs []error
	for _, soname := range Libraries {
		base := soname
		if i := strings.Index(soname, ".so"); i >= 0 {
			base = soname[:i+len(".so")]
		}
		file := base + "." + version
		path := filepath.Join(lib, file)
		if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
			errs = append(errs, os.WriteFile(path, []byte("hwdra mock stand-in for "+file+"\n"), 0o755))
		}
		if soname == base {
			continue
		}
		link := filepath.Join(lib, soname)
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			errs = append(errs, os.Symlink(file, link))
		}
	}
	return errors.Join(errs...)
}
