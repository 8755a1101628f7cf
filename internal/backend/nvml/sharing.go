// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ComputeMode is a GPU's compute mode, by NVML's names without prefix.
type ComputeMode string

const (
	// ComputeDefault: any number of processes may hold a context.
	ComputeDefault ComputeMode = "Default"
	// ComputeExclusiveProcess: one process holds a context (an MPS
	// server, whose clients then share the GPU through it).
	ComputeExclusiveProcess ComputeMode = "ExclusiveProcess"
	// ComputeProhibited: no process may hold a context.
	ComputeProhibited ComputeMode = "Prohibited"
)

var computeModes = map[ComputeMode]nvml.ComputeMode{
	ComputeDefault:          nvml.COMPUTEMODE_DEFAULT,
	ComputeExclusiveProcess: nvml.COMPUTEMODE_EXCLUSIVE_PROCESS,
	ComputeProhibited:       nvml.COMPUTEMODE_PROHIBITED,
}

// ComputeMode reads a GPU's compute mode.
func (b *Backend) ComputeMode(busID string) (ComputeMode, error) {
	var out ComputeMode
	err := b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		m, ret := dev.GetComputeMode()
		if ret != nvml.SUCCESS {
			return ref.err("GetComputeMode", ret)
		}
		for name, v := range computeModes {
			if v == m {
				out = name
				return nil
			}
		}
		return fmt.Errorf("%s: compute mode %d is none the agent knows", ref, m)
	})
	return out, err
}

// SetComputeMode sets a GPU's compute mode (root only).
func (b *Backend) SetComputeMode(busID string, mode ComputeMode) error {
	v, ok := computeModes[mode]
	if !ok {
		return fmt.Errorf("GPU %s: unknown compute mode %q", busID, mode)
	}
	return b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		if ret := dev.SetComputeMode(v); ret != nvml.SUCCESS {
			return ref.err("SetComputeMode("+string(mode)+")", ret)
		}
		return nil
	})
}

// Programs are the NVIDIA driver's programs (nvidia-smi,
// nvidia-cuda-mps-control) as this process runs them: from the driver
// root's usr/bin, with the root's libraries where the root is not this
// process's own (a driver container's, mounted into the agent's).
type Programs struct {
	// Bin is the directory of the programs.
	Bin string
	// LibraryPath lists the driver's library directories: the programs
	// get them as LD_LIBRARY_PATH. Empty: the loader's search.
	LibraryPath []string
}

// Path is a program's path.
func (p Programs) Path(name string) string { return filepath.Join(p.Bin, name) }

// Check says whether a program is there to run: an error naming it and
// where it was looked for when not (a driver installed without its
// programs: NVML and the libraries alone).
func (p Programs) Check(name string) error {
	path := p.Path(name)
	st, err := os.Stat(path)
	if err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return nil
	}
	return fmt.Errorf("the NVIDIA driver's %s is not at %s: the driver installation lacks its programs, which MPS claims, GPU shares and time-sliced claims need (look for it with hwdra doctor; --nvidia-driver-root names the root)", name, path)
}

// Command runs a program of the driver with env added to this process's
// environment.
func (p Programs) Command(ctx context.Context, name string, env []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, p.Path(name), args...)
	cmd.Env = append(os.Environ(), env...)
	if len(p.LibraryPath) > 0 {
		cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+strings.Join(p.LibraryPath, ":"))
	}
	cmd.WaitDelay = time.Second
	return cmd
}

// TimeSlices is the number of compute time slices the driver offers,
// 0 (default) to 3 (long).
const TimeSlices = 4

// SetTimeSlice sets a GPU's compute time slice (0 default, 1 short, 2
// medium, 3 long). NVML has no call for it (its scheduler calls are for
// vGPU hosts): the driver's nvidia-smi sets it.
func (p Programs) SetTimeSlice(ctx context.Context, uuid string, n int) error {
	if n < 0 || n >= TimeSlices {
		return fmt.Errorf("GPU %s: time slice %d: must be 0 to %d", uuid, n, TimeSlices-1)
	}
	if err := p.Check("nvidia-smi"); err != nil {
		return fmt.Errorf("GPU %s: time slice: %w", uuid, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := p.Command(ctx, "nvidia-smi", nil, "compute-policy", "-i", uuid, "--set-timeslice", strconv.Itoa(n)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("GPU %s: nvidia-smi compute-policy --set-timeslice %d: %w: %s", uuid, n, err, strings.TrimSpace(string(out)))
	}
	return nil
}
