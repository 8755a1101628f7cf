// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/procstat"
)

// The processes with a context on a GPU. A test (or `hwdra mock inject
// processes`) sets them; NVML lists them as the driver does: the compute
// list holds every one, MPS clients included (nvidia-smi shows them as
// "M+C" beside the MPS server), the MPS list the MPS clients alone.
//
// Like the driver, the mock drops a process once it exits: a PID that ran
// on this machine when it was set is remembered with its start time and
// left out once that PID is gone or belongs to a later process. A PID
// that did not exist when set (a test's made-up one) stays listed until
// the list is set again.

// installProcesses answers NVML's process lists.
func (d *gpu) installProcesses() {
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return d.processInfos(false) }
	d.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return d.processInfos(true) }
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }
}

// processInfos is NVML's compute list, or with mpsOnly its MPS list.
func (d *gpu) processInfos(mpsOnly bool) ([]nvml.ProcessInfo, nvml.Return) {
	if d.isLost() {
		return nil, nvml.ERROR_GPU_IS_LOST
	}
	d.RLock()
	defer d.RUnlock()
	out := []nvml.ProcessInfo{}
	for _, p := range d.runningLocked() {
		if mpsOnly && !p.MPS {
			continue
		}
		// What the driver fills in where it cannot tell: all ones.
		info := nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: ^uint64(0), GpuInstanceId: noInstance, ComputeInstanceId: noInstance}
		if p.UsedMemory != nil {
			info.UsedGpuMemory = *p.UsedMemory
		}
		if p.GPUInstance != nil {
			// hw.GPUProcess carries no compute instance: the first.
			info.GpuInstanceId, info.ComputeInstanceId = uint32(*p.GPUInstance), 0
		}
		out = append(out, info)
	}
	return out, nvml.SUCCESS
}

// runningLocked are the processes set, less those that have exited since;
// the caller holds the device lock.
func (d *gpu) runningLocked() []persist.ProcessState {
	var out []persist.ProcessState
	for _, p := range d.processes {
		if p.StartTime != 0 {
			if st, err := procstat.StartTime(int(p.PID)); err != nil || st != p.StartTime {
				continue
			}
		}
		out = append(out, p)
	}
	return out
}

// SetProcesses makes the GPU at a PCI address list these processes as
// running on it (none: idle), replacing those set before. PIDs are in
// this machine's PID namespace. A GPU instance needs MIG mode on and that
// instance to exist. The hardware refuses to switch MIG mode while any
// run.
func (g *GPUs) SetProcesses(busID string, procs []hw.GPUProcess) error {
	d, err := g.find(busID)
	if err != nil {
		return err
	}
	set := make([]persist.ProcessState, 0, len(procs))
	for _, p := range procs {
		s := persist.ProcessState{GPUProcess: hw.GPUProcess{PID: p.PID, MPS: p.MPS}}
		// Copies: the caller's pointers stay the caller's.
		if p.UsedMemory != nil {
			s.UsedMemory = ptr(*p.UsedMemory)
		}
		if p.GPUInstance != nil {
			s.GPUInstance = ptr(*p.GPUInstance)
		}
		if st, err := procstat.StartTime(int(p.PID)); err == nil {
			s.StartTime = st
		}
		set = append(set, s)
	}
	slices.SortFunc(set, func(a, b persist.ProcessState) int { return cmp.Compare(a.PID, b.PID) })
	d.Lock()
	err = d.checkProcessesLocked(set)
	if err == nil {
		for _, p := range set {
			if p.GPUInstance != nil && !slices.ContainsFunc(d.instancesLocked(), func(gi *server.GpuInstance) bool { return int(gi.Info.Id) == *p.GPUInstance }) {
				err = fmt.Errorf("process %d: no GPU instance %d on the GPU (MIG mode %s)", p.PID, *p.GPUInstance, migWord(d.migCurrent))
				break
			}
		}
	}
	if err == nil {
		d.processes = set
	}
	d.Unlock()
	if err != nil {
		return fmt.Errorf("GPU %s: %w", d.busID, err)
	}
	d.changed(persist.CallSetRunningProcesses, true)
	return nil
}

// SetRunningProcesses is SetProcesses of PIDs alone: processes outside
// MPS and MIG whose memory the driver does not tell.
func (g *GPUs) SetRunningProcesses(busID string, pids ...uint32) error {
	procs := make([]hw.GPUProcess, len(pids))
	for i, pid := range pids {
		procs[i].PID = pid
	}
	return g.SetProcesses(busID, procs)
}

// checkProcessesLocked holds a process list to what a driver could list
// (for SetProcesses and for a saved state): PIDs above 0, each once, no
// more memory than the GPU has, GPU instance IDs in range.
func (d *gpu) checkProcessesLocked(procs []persist.ProcessState) error {
	seen := map[uint32]bool{}
	for _, p := range procs {
		switch {
		case p.PID == 0:
			return fmt.Errorf("process ID 0")
		case seen[p.PID]:
			return fmt.Errorf("process %d listed twice", p.PID)
		case p.UsedMemory != nil && *p.UsedMemory > d.MemoryInfo.Total:
			return fmt.Errorf("process %d: %d bytes of GPU memory, the GPU has %d", p.PID, *p.UsedMemory, d.MemoryInfo.Total)
		case p.GPUInstance != nil && (*p.GPUInstance < 0 || *p.GPUInstance >= maxGIs):
			return fmt.Errorf("process %d: GPU instance %d out of range", p.PID, *p.GPUInstance)
		}
		seen[p.PID] = true
	}
	return nil
}

func migWord(mode int) string {
	if mode == nvml.DEVICE_MIG_ENABLE {
		return "on"
	}
	return "off"
}

func ptr[T any](v T) *T { return &v }
