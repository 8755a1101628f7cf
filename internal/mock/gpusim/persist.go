// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/mock/persist"
)

// Snapshot puts the GPUs' state in s: each GPU's, in PCI order, the
// mediated devices and whether the driver is loaded.
func (g *GPUs) Snapshot(s *persist.State) {
	for _, d := range g.all() {
		s.GPUs = append(s.GPUs, d.snapshot())
	}
	sort.Slice(s.GPUs, func(i, j int) bool { return s.GPUs[i].BusID < s.GPUs[j].BusID })
	s.Mdevs = g.kernel.snapshot()
	s.VFVGPUs = g.kernel.snapshotVFs()
	s.DriverUnloaded = g.driver != nil && g.driver.unloaded.Load()
}

// Restore puts freshly built GPUs in a saved state: the driver, then each
// GPU (MIG modes, instances), then the vGPUs on them.
func (g *GPUs) Restore(s persist.State) error {
	if g.driver != nil {
		if err := g.loadModule(!s.DriverUnloaded); err != nil {
			return err
		}
		g.driver.unloaded.Store(s.DriverUnloaded)
	}
	for _, gs := range s.GPUs {
		if g.srv == nil {
			return fmt.Errorf("GPU %s: the profile has no GPUs", gs.BusID)
		}
		d, err := g.find(gs.BusID)
		if err != nil {
			return err
		}
		if err := d.restore(gs); err != nil {
			return fmt.Errorf("GPU %s: %w", gs.BusID, err)
		}
		d.notify()
	}
	if len(s.Mdevs)+len(s.VFVGPUs) > 0 && g.kernel == nil {
		return fmt.Errorf("vGPUs saved, but the profile has no vGPU host")
	}
	if len(s.Mdevs) > 0 {
		if err := g.kernel.restore(s.Mdevs); err != nil {
			return err
		}
	}
	if len(s.VFVGPUs) > 0 {
		return g.kernel.restoreVFs(s.VFVGPUs)
	}
	return nil
}

// snapshot is the GPU's saved state. Lock order: device, then GPU
// instance, as the NVML calls take them.
func (d *gpu) snapshot() persist.GPUState {
	d.RLock()
	defer d.RUnlock()
	s := persist.GPUState{
		BusID: d.busID, UUID: d.UUID,
		MIG:         persist.MIGState{Current: d.migCurrent == nvml.DEVICE_MIG_ENABLE, Pending: d.migPending == nvml.DEVICE_MIG_ENABLE},
		NextSerial:  d.nextSerial.Load(),
		ComputeMode: int(d.computeMode), TimeSlice: d.timeSlice,
	}
	s.Lost, s.RecoveryAction = d.healthState()
	// What the driver would list: a process that has exited is gone.
	s.Processes = d.runningLocked()
	for _, gi := range d.instancesLocked() {
		p, _ := d.model.ProfileByID(gi.Info.ProfileId)
		g := persist.GPUInstanceState{
			ID: int(gi.Info.Id), Profile: p.Name, ProfileID: gi.Info.ProfileId,
			Start: int(gi.Info.Placement.Start), Size: int(gi.Info.Placement.Size),
		}
		gi.RLock()
		for _, ci := range computeInstancesLocked(gi) {
			serial, _ := d.serials.Load(ci)
			n, _ := serial.(uint64)
			uuid, _ := d.migDevice(gi, ci).GetUUID()
			g.ComputeInstances = append(g.ComputeInstances, persist.ComputeInstanceState{
				ID: int(ci.Info.Id), ProfileID: ci.Info.ProfileId,
				Start: int(ci.Info.Placement.Start), Size: int(ci.Info.Placement.Size),
				Serial: n, UUID: uuid,
			})
		}
		gi.RUnlock()
		s.GPUInstances = append(s.GPUInstances, g)
	}
	return s
}

// restore puts the freshly built GPU in a saved state: the instances the
// profile created at start give way to the saved ones, recreated with
// their IDs and creation numbers (so their MIG UUIDs are the same).
func (d *gpu) restore(s persist.GPUState) error {
	d.Lock()
	defer d.Unlock()
	if s.UUID != "" && s.UUID != d.UUID {
		return fmt.Errorf("saved UUID %s, the profile gives %s", s.UUID, d.UUID)
	}
	clear(d.GpuInstances)
	d.serials.Clear()
	d.tree.removeGPU(d.Minor)
	mode := func(on bool) int {
		if on {
			return nvml.DEVICE_MIG_ENABLE
		}
		return nvml.DEVICE_MIG_DISABLE
	}
	d.migCurrent, d.migPending = mode(s.MIG.Current), mode(s.MIG.Pending)
	d.MigMode = d.migCurrent
	d.computeMode, d.timeSlice = nvml.ComputeMode(s.ComputeMode), s.TimeSlice
	if err := d.checkProcessesLocked(s.Processes); err != nil {
		return err
	}
	d.processes = slices.Clone(s.Processes)
	for _, g := range s.GPUInstances {
		p, ok := d.model.ProfileByID(g.ProfileID)
		if !ok || g.ID < 0 || g.ID >= maxGIs {
			return fmt.Errorf("GPU instance %d: %s has no GPU instance profile ID %d", g.ID, d.model.Name, g.ProfileID)
		}
		pl := nvml.GpuInstancePlacement{Start: uint32(g.Start), Size: uint32(g.Size)}
		gi, err := d.addGILocked(g.ID, p, pl)
		if err != nil {
			return fmt.Errorf("GPU instance %d: %w", g.ID, err)
		}
		gi.Lock()
		for _, c := range g.ComputeInstances {
			if c.ID < 0 || c.ID >= maxCIs {
				gi.Unlock()
				return fmt.Errorf("GPU instance %d: compute instance ID %d out of range", g.ID, c.ID)
			}
			cpl := nvml.ComputeInstancePlacement{Start: uint32(c.Start), Size: uint32(c.Size)}
			if _, err := d.addCILocked(gi, c.ID, c.ProfileID, cpl, c.Serial); err != nil {
				gi.Unlock()
				return fmt.Errorf("GPU instance %d, compute instance %d: %w", g.ID, c.ID, err)
			}
		}
		gi.Unlock()
	}
	d.nextSerial.Store(s.NextSerial)
	d.restoreHealth(s.Lost, s.RecoveryAction)
	return nil
}

// snapshot lists the mediated devices, by UUID.
func (k *mdevKernel) snapshot() []persist.MdevState {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []persist.MdevState
	for _, p := range k.parents {
		v := p.hosted
		if v == nil || p.vfio {
			continue
		}
		m := persist.MdevState{UUID: v.uuid, GPU: p.gpu.busID, Parent: p.addr, TypeID: v.typeID, GPUInstance: v.gi, IOMMUGroup: v.group}
		for _, t := range p.gpu.vgpus {
			if t.GetID() == v.typeID {
				m.Type, _ = t.GetName()
			}
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UUID < out[j].UUID })
	return out
}

// restore recreates saved mediated devices on their parents, with their
// UUIDs and IOMMU groups, after the GPUs were restored.
func (k *mdevKernel) restore(saved []persist.MdevState) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	var touched []*gpu
	for _, m := range saved {
		p := k.parents[m.Parent]
		if p == nil || p.vfio {
			return fmt.Errorf("mediated device %s: no mdev parent %s", m.UUID, m.Parent)
		}
		if !slices.ContainsFunc(p.gpu.vgpus, func(t nvml.VgpuTypeId) bool { return t.GetID() == m.TypeID }) {
			return fmt.Errorf("mediated device %s: GPU %s has no vGPU type %d", m.UUID, p.gpu.busID, m.TypeID)
		}
		if p.hosted != nil || k.groups[m.IOMMUGroup] {
			return fmt.Errorf("mediated device %s: parent %s or IOMMU group %d taken twice", m.UUID, m.Parent, m.IOMMUGroup)
		}
		v := &vgpuInstance{uuid: m.UUID, typeID: m.TypeID, gi: m.GPUInstance, parent: p, group: m.IOMMUGroup}
		if err := k.publish(v, filepath.Join(p.dir, "mdev_supported_types", typeDirName(m.TypeID))); err != nil {
			return fmt.Errorf("mediated device %s: %w", m.UUID, err)
		}
		k.groups[v.group] = true
		p.hosted = v
		p.gpu.Lock()
		p.gpu.active = append(p.gpu.active, v)
		p.gpu.Unlock()
		if !slices.Contains(touched, p.gpu) {
			touched = append(touched, p.gpu)
		}
	}
	for _, d := range touched {
		k.refreshLocked(d)
	}
	return nil
}

// gpuOf is the PCI address of the GPU behind an mdev parent (the parent's
// address if it is none of the node's).
func (k *mdevKernel) gpuOf(parent string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	if p := k.parents[parent]; p != nil {
		return p.gpu.busID
	}
	return parent
}
