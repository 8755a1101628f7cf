// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/mock/persist"
)

// A GPU's sharing settings: its compute mode (NVML) and the compute time
// slice that `nvidia-smi compute-policy --set-timeslice` sets (NVML has no
// call for it; the mock's nvidia-smi reaches the GPU through the mock's
// inbox, see mock/drivertools).

// installSharing answers NVML's compute mode calls as the hardware does.
func (d *gpu) installSharing() {
	d.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) {
		d.RLock()
		defer d.RUnlock()
		return d.computeMode, nvml.SUCCESS
	}
	d.SetComputeModeFunc = func(mode nvml.ComputeMode) nvml.Return {
		switch mode {
		case nvml.COMPUTEMODE_DEFAULT, nvml.COMPUTEMODE_PROHIBITED, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		case nvml.COMPUTEMODE_EXCLUSIVE_THREAD:
			// Removed from the driver since CUDA 8.
			d.changed(persist.CallSetComputeMode, false)
			return nvml.ERROR_NOT_SUPPORTED
		default:
			d.changed(persist.CallSetComputeMode, false)
			return nvml.ERROR_INVALID_ARGUMENT
		}
		d.Lock()
		d.computeMode = mode
		d.Unlock()
		d.changed(persist.CallSetComputeMode, true)
		return nvml.SUCCESS
	}
}

// MaxTimeSlice is the longest time slice nvidia-smi offers (0 default, 1
// short, 2 medium, 3 long).
const MaxTimeSlice = 3

// SetTimeSlice sets the compute time slice of the GPU with a UUID or at a
// PCI address, as `nvidia-smi compute-policy -i ID --set-timeslice N`.
func (g *GPUs) SetTimeSlice(id string, n int) error {
	d, err := g.lookup(id)
	if err != nil {
		return err
	}
	if n < 0 || n > MaxTimeSlice {
		d.changed(persist.CallSetTimeSlice, false)
		return fmt.Errorf("time slice %d: must be 0 (default), 1 (short), 2 (medium) or 3 (long)", n)
	}
	d.Lock()
	d.timeSlice = n
	d.Unlock()
	d.changed(persist.CallSetTimeSlice, true)
	return nil
}

// TimeSlice is the GPU's compute time slice (0: the default).
func (g *GPUs) TimeSlice(busID string) (int, error) {
	d, err := g.find(busID)
	if err != nil {
		return 0, err
	}
	d.RLock()
	defer d.RUnlock()
	return d.timeSlice, nil
}

// ComputeMode is the GPU's compute mode.
func (g *GPUs) ComputeMode(busID string) (nvml.ComputeMode, error) {
	d, err := g.find(busID)
	if err != nil {
		return 0, err
	}
	d.RLock()
	defer d.RUnlock()
	return d.computeMode, nil
}

// lookup finds a GPU by UUID ("GPU-...") or PCI address, as nvidia-smi's
// -i takes either.
func (g *GPUs) lookup(id string) (*gpu, error) {
	for _, d := range g.all() {
		if d.UUID == id {
			return d, nil
		}
	}
	return g.find(id)
}
