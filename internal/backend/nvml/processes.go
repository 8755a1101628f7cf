// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"cmp"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
)

// memoryNotAvailable is NVML_VALUE_NOT_AVAILABLE (-1) as the unsigned
// usedGpuMemory field carries it: the driver does not tell (vGPU guests,
// some older drivers, Windows WDDM).
const memoryNotAvailable = ^uint64(0)

// GPUProcesses lists the processes with a context on the GPU at a PCI
// address, sorted by PID: the union, by PID, of the driver's compute list
// and its MPS client list (MPS set for those in the latter).
//
// Hardware quirk: on an H200 (driver 550+) nvidia-smi lists each MPS
// client as type "M+C" with its own GPU memory beside
// nvidia-cuda-mps-server: NVML sees through MPS. Which of the two lists
// carries a client, or whether both do, is not pinned down across
// drivers, hence the union; a client's memory is taken from the compute
// list where it tells it, else from the MPS list (never added: a client
// in both is one context listed twice).
//
// A PID listed more than once in one list (contexts in several MIG GPU
// instances) is one process: its memory is summed (unknown if any entry
// does not tell) and it is given the lowest GPU instance.
func (b *Backend) GPUProcesses(busID string) ([]hw.GPUProcess, error) {
	var out []hw.GPUProcess
	err := b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		compute, ret := dev.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			return ref.err("GetComputeRunningProcesses", ret)
		}
		// Hardware quirk: drivers before the MPS list answer
		// NOT_SUPPORTED (and the oldest libraries lack the symbol, which
		// go-nvml would call anyway: a process death, so look first);
		// there the compute list is all NVML tells.
		var mps []nvml.ProcessInfo
		if b.has("nvmlDeviceGetMPSComputeRunningProcesses_v3") || b.has("nvmlDeviceGetMPSComputeRunningProcesses_v2") ||
			b.has("nvmlDeviceGetMPSComputeRunningProcesses") {
			list, ret := dev.GetMPSComputeRunningProcesses()
			if ok, err := ref.optional("GetMPSComputeRunningProcesses", ret); err != nil {
				return err
			} else if ok {
				mps = list
			}
		}
		byPID := map[uint32]*hw.GPUProcess{}
		inMIG := false
		for _, list := range []struct {
			infos []nvml.ProcessInfo
			mps   bool
		}{{compute, false}, {mps, true}} {
			for pid, p := range mergeByPID(list.infos) {
				have := byPID[pid]
				if have == nil {
					byPID[pid] = &p
					have = &p
				} else if have.UsedMemory == nil {
					have.UsedMemory = p.UsedMemory
				}
				if have.GPUInstance == nil {
					have.GPUInstance = p.GPUInstance
				}
				have.MPS = have.MPS || list.mps
				inMIG = inMIG || have.GPUInstance != nil
			}
		}
		// Hardware quirk: NVML documents gpuInstanceId as valid only with
		// MIG on (0xFFFFFFFF otherwise); do not trust an ID that a GPU
		// with MIG off reports.
		if inMIG {
			current, _, ret := dev.GetMigMode()
			if ok, err := ref.optional("GetMigMode", ret); err != nil {
				return err
			} else if !ok || current != nvml.DEVICE_MIG_ENABLE {
				for _, p := range byPID {
					p.GPUInstance = nil
				}
			}
		}
		for _, p := range byPID {
			out = append(out, *p)
		}
		return nil
	})
	slices.SortFunc(out, func(a, b hw.GPUProcess) int { return cmp.Compare(a.PID, b.PID) })
	return out, err
}

// mergeByPID turns one NVML list into one process per PID: a process
// with contexts in several MIG GPU instances is listed once per context.
func mergeByPID(infos []nvml.ProcessInfo) map[uint32]hw.GPUProcess {
	out := map[uint32]hw.GPUProcess{}
	unknown := map[uint32]bool{}
	for _, info := range infos {
		p := out[info.Pid]
		p.PID = info.Pid
		if info.UsedGpuMemory == memoryNotAvailable {
			unknown[info.Pid] = true
		} else {
			p.UsedMemory = ptr(info.UsedGpuMemory + deref(p.UsedMemory))
		}
		if info.GpuInstanceId != invalidGIID && (p.GPUInstance == nil || int(info.GpuInstanceId) < *p.GPUInstance) {
			p.GPUInstance = ptr(int(info.GpuInstanceId))
		}
		out[info.Pid] = p
	}
	for pid := range unknown {
		p := out[pid]
		p.UsedMemory = nil
		out[pid] = p
	}
	return out
}

func ptr[T any](v T) *T { return &v }

func deref(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}
