// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package profile

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/mock/model"
	"github.com/hwdra/hwdra/internal/mock/nodefs"
)

// validate checks one GPU group; errors start with the field name.
func (g GPUGroup) validate() error {
	m, ok := model.LookupGPU(g.Model)
	if !ok {
		return fmt.Errorf("model: unknown GPU model %q (known: %s)", g.Model, strings.Join(model.GPUNames(), ", "))
	}
	if g.Count < 1 {
		return fmt.Errorf("count: must be at least 1, is %d", g.Count)
	}
	if g.PCIBusIDs != nil && len(g.PCIBusIDs) != g.Count {
		return fmt.Errorf("pciBusIDs: has %d entries, count is %d", len(g.PCIBusIDs), g.Count)
	}
	for i, id := range g.PCIBusIDs {
		if c, ok := nodefs.CanonicalAddress(id); !ok || c != id {
			return fmt.Errorf("pciBusIDs[%d]: %q is not a lower-case PCI address like 0000:1b:00.0", i, id)
		}
		if j := slices.Index(g.PCIBusIDs, id); j < i {
			return fmt.Errorf("pciBusIDs[%d]: %s is also pciBusIDs[%d]", i, id, j)
		}
	}
	if g.NUMANodes != nil && len(g.NUMANodes) != g.Count {
		return fmt.Errorf("numaNodes: has %d entries, count is %d", len(g.NUMANodes), g.Count)
	}
	for i, n := range g.NUMANodes {
		if n < -1 {
			return fmt.Errorf("numaNodes[%d]: %d is not a NUMA node (-1 for none)", i, n)
		}
	}
	_, timings := g.Timings.Durations()
	return errors.Join(g.validateMIG(m), timings, g.validateVGPU(m))
}

func (g GPUGroup) validateMIG(m *model.GPU) error {
	if len(g.MIGInstances) > 0 && !g.MIG {
		return fmt.Errorf("migInstances: need mig: true")
	}
	var existing []model.Placed
	for i, mi := range g.MIGInstances {
		p, ok := m.ProfileByName(mi.Profile)
		if !ok {
			return fmt.Errorf("migInstances[%d]: profile %q not offered by %s (offered: %s)",
				i, mi.Profile, m.Name, strings.Join(m.ProfileNames(), ", "))
		}
		if !slices.Contains(p.Starts, mi.Start) {
			return fmt.Errorf("migInstances[%d]: start %d is not a placement of %s on %s (starts: %s)",
				i, mi.Start, p.Name, m.Name, strings.Trim(fmt.Sprint(p.Starts), "[]"))
		}
		pl := nvml.GpuInstancePlacement{Start: uint32(mi.Start), Size: uint32(p.Size)}
		for j, e := range existing {
			if model.Overlap(e.Placement, pl) {
				return fmt.Errorf("migInstances[%d]: %s at %d overlaps migInstances[%d] (%s at %d)",
					i, p.Name, mi.Start, j, e.Profile.Name, e.Placement.Start)
			}
		}
		if m.Fits(existing, p, pl) != nvml.SUCCESS {
			return fmt.Errorf("migInstances[%d]: no room for %s on %s (at most %d instances, %d compute slices in all)",
				i, p.Name, m.Name, p.Count, m.ComputeSlices)
		}
		existing = append(existing, model.Placed{Profile: p, Placement: pl})
	}
	return nil
}

func (g GPUGroup) validateVGPU(m *model.GPU) error {
	switch g.Virtualization {
	case "", VirtualizationNone, VirtualizationHostVGPU:
	case VirtualizationPassthrough:
		// Bound to vfio-pci: the NVIDIA driver has no hold on the GPU.
		switch {
		case g.MIG:
			return fmt.Errorf("mig: a GPU bound to vfio-pci (virtualization: passthrough) has no MIG mode")
		case g.NoRecoveryAction:
			return fmt.Errorf("noRecoveryAction: a GPU bound to vfio-pci (virtualization: passthrough) has no NVIDIA driver")
		}
	default:
		return fmt.Errorf("virtualization: unknown mode %q (known: %s, %s, %s)", g.Virtualization,
			VirtualizationNone, VirtualizationHostVGPU, VirtualizationPassthrough)
	}
	host := g.Virtualization == VirtualizationHostVGPU
	switch g.VGPUFramework {
	case "", VGPUFrameworkMdev:
	case VGPUFrameworkVFIO:
		if !m.HopperOrLater() {
			return fmt.Errorf("vgpuFramework: %s has no vendor-specific VFIO framework (Ada, Hopper and later have)", m.Name)
		}
	default:
		return fmt.Errorf("vgpuFramework: unknown framework %q (known: %s, %s)", g.VGPUFramework, VGPUFrameworkMdev, VGPUFrameworkVFIO)
	}
	if g.VGPUFramework != "" && !host {
		return fmt.Errorf("vgpuFramework: needs virtualization: host-vgpu")
	}
	if len(g.VGPUTypes) > 0 && !host {
		return fmt.Errorf("vgpuTypes: need virtualization: host-vgpu")
	}
	if g.VGPUHeterogeneous && !host {
		return fmt.Errorf("vgpuHeterogeneous: need virtualization: host-vgpu")
	}
	if g.VGPUHeterogeneous && !m.HopperOrLater() {
		return fmt.Errorf("vgpuHeterogeneous: %s has no heterogeneous vGPU mode (Hopper and later have)", m.Name)
	}
	for i, t := range g.VGPUTypes {
		switch {
		case t.Name == "":
			return fmt.Errorf("vgpuTypes[%d].name: must be set", i)
		case slices.IndexFunc(g.VGPUTypes, func(o VGPUType) bool { return o.Name == t.Name }) < i:
			return fmt.Errorf("vgpuTypes[%d].name: %q appears twice", i, t.Name)
		case t.FramebufferMB == 0:
			return fmt.Errorf("vgpuTypes[%d].framebufferMB: must be more than 0", i)
		case t.MaxInstances < 1:
			return fmt.Errorf("vgpuTypes[%d].maxInstances: must be at least 1", i)
		}
		if _, ok := m.ProfileByName(t.MIGProfile); t.MIGProfile != "" && !ok {
			return fmt.Errorf("vgpuTypes[%d].migProfile: %q not offered by %s (offered: %s)",
				i, t.MIGProfile, m.Name, strings.Join(m.ProfileNames(), ", "))
		}
	}
	return nil
}
