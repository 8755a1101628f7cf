// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"fmt"

	"github.com/hwdra/hwdra/internal/hw"
)

const gib = 1 << 30

// h100 is an H100 80GB as NVML reports it: placements in memory-slice
// units, engine counts from NVIDIA's MIG user guide.
func h100(bus string, numa int) hw.GPU {
	prof := func(id int, name string, slices, count, sms, ce, dec, jpg, ofa int, memGiB uint64, size int, starts ...int) hw.MIGProfile {
		p := hw.MIGProfile{ID: id, Name: name, Slices: slices, InstanceCount: count, Multiprocessors: sms,
			CopyEngines: ce, Decoders: dec, JPEGEngines: jpg, OFAEngines: ofa, MemoryBytes: memGiB * gib}
		for _, s := range starts {
			p.Placements = append(p.Placements, hw.Placement{Start: s, Size: size})
		}
		return p
	}
	return hw.GPU{
		UUID: "GPU-" + bus, ProductName: "NVIDIA H100 80GB HBM3", PCIBusID: bus, MemoryBytes: 80 * gib,
		Architecture: "hopper", CUDAComputeCapability: "9.0", DriverVersion: "550.54.15", CUDADriverVersion: "12.4",
		NUMANode: numa, PCIeRoot: "pci0000:" + bus[5:7],
		MIG: hw.MIG{Capable: true, SwitchWithoutReset: true, MemorySlices: 8, Profiles: []hw.MIGProfile{
			prof(0, "1g.10gb", 1, 7, 16, 1, 1, 1, 0, 10, 1, 0, 1, 2, 3, 4, 5, 6),
			prof(1, "2g.20gb", 2, 3, 32, 2, 2, 2, 0, 20, 2, 0, 2, 4),
			prof(2, "3g.40gb", 3, 2, 60, 3, 3, 3, 0, 40, 4, 0, 4),
			prof(3, "4g.40gb", 4, 1, 64, 4, 4, 4, 0, 40, 4, 0),
			prof(4, "7g.80gb", 7, 1, 132, 8, 7, 7, 1, 80, 8, 0),
			prof(7, "1g.10gb+me", 1, 1, 16, 1, 1, 1, 1, 10, 1, 0, 1, 2, 3, 4, 5, 6),
			prof(9, "1g.20gb", 1, 4, 16, 1, 1, 1, 0, 20, 2, 0, 2, 4, 6),
		}},
		Virtualization: hw.VirtualizationNone,
	}
}

// h100VGPU is an H100 in host-vGPU mode with time-sliced and MIG-backed types.
func h100VGPU(bus string) hw.GPU {
	g := h100(bus, 0)
	g.Virtualization = hw.VirtualizationHostVGPU
	g.VGPU.Framework, g.VGPU.VFs = hw.VGPUFrameworkMdev, 16
	id := func(i int) *int { return &i }
	g.VGPU.Types = []hw.VGPUType{
		{ID: 1, Name: "NVIDIA H100-80C", Class: "Compute", FramebufferBytes: 80 * gib, MaxInstances: 1},
		{ID: 2, Name: "NVIDIA H100-40C", Class: "Compute", FramebufferBytes: 40 * gib, MaxInstances: 2},
		{ID: 3, Name: "NVIDIA H100-20C", Class: "Compute", FramebufferBytes: 20 * gib, MaxInstances: 4},
		{ID: 10, Name: "NVIDIA H100-1-10C", Class: "Compute", FramebufferBytes: 10 * gib, MaxInstances: 7, GPUInstanceProfileID: id(0)},
		{ID: 11, Name: "NVIDIA H100-3-40C", Class: "Compute", FramebufferBytes: 40 * gib, MaxInstances: 2, GPUInstanceProfileID: id(2)},
	}
	for i := range g.VGPU.Types {
		g.VGPU.Types[i].Creatable = true
	}
	return g
}

// dgx is n H100s on distinct buses, half per NUMA node.
func dgx(n int) []hw.GPU {
	var gpus []hw.GPU
	for i := 0; i < n; i++ {
		gpus = append(gpus, h100(fmt.Sprintf("0000:%02x:00.0", 0x10+i*0x10), i*2/n))
	}
	return gpus
}
