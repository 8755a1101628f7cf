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
	"os"
	"path/filepath"
)

// The programs' names, as the driver installs them in <root>/usr/bin.
const (
	MPSControl = "nvidia-cuda-mps-control"
	SMI        = "nvidia-smi"
)

// BinDir is where the programs are, relative to the driver root.
const BinDir = "usr/bin"

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

// Install links the stand-ins into driverRoot/usr/bin: symlinks to this
// executable, whose init runs them.
func Install(driverRoot string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("mock driver tools: %w", err)
	}
	bin := filepath.Join(driverRoot, BinDir)
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	var errs []error
	for _, name := range []string{MPSControl, SMI} {
		link := filepath.Join(bin, name)
		if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, os.Symlink(self, link))
	}
	return errors.Join(errs...)
}
