// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/hwdra/hwdra/internal/mock/model"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

// installMIG replaces the server's MIG functions, which validate nothing,
// with ones that refuse what the hardware refuses. Lock order: device,
// then GPU instance.
func (d *gpu) installMIG() {
	sd := d.Device
	sd.GetGpuInstancePossiblePlacementsFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		if info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		p, ok := d.model.ProfileByID(info.Id)
		if !ok {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		return p.Placements(), nvml.SUCCESS
	}
	sd.CreateGpuInstanceFunc = func(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
		gi, ret := d.createGI(info, nil)
		d.notify()
		d.changed(persist.CallCreateGpuInstance, ret == nvml.SUCCESS)
		return gi, ret
	}
	sd.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		if pl == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		gi, ret := d.createGI(info, pl)
		d.notify()
		d.changed(persist.CallCreateGpuInstance, ret == nvml.SUCCESS)
		return gi, ret
	}
	sd.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		if info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		d.RLock()
		defer d.RUnlock()
		// NVML: NOT_SUPPORTED "if device doesn't have MIG mode enabled".
		if d.migCurrent != nvml.DEVICE_MIG_ENABLE {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		var out []nvml.GpuInstance
		for _, gi := range d.instancesLocked() {
			if gi.Info.ProfileId == info.Id {
				out = append(out, gi)
			}
		}
		return out, nvml.SUCCESS
	}
	sd.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		d.RLock()
		defer d.RUnlock()
		if d.migCurrent != nvml.DEVICE_MIG_ENABLE {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		for _, gi := range d.instancesLocked() {
			if int(gi.Info.Id) == id {
				return gi, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	sd.GetGpuInstanceRemainingCapacityFunc = func(info *nvml.GpuInstanceProfileInfo) (int, nvml.Return) {
		if info == nil {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		p, ok := d.model.ProfileByID(info.Id)
		if !ok {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		d.RLock()
		defer d.RUnlock()
		if d.migCurrent != nvml.DEVICE_MIG_ENABLE {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		return d.remainingLocked(p), nvml.SUCCESS
	}
	sd.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return d.model.ComputeSlices, nvml.SUCCESS }
	sd.GetMigDeviceHandleByIndexFunc = d.migDeviceByIndex
}

// instancesLocked returns the GPU instances sorted by ID.
func (d *gpu) instancesLocked() []*server.GpuInstance {
	out := make([]*server.GpuInstance, 0, len(d.GpuInstances))
	for gi := range d.GpuInstances {
		out = append(out, gi)
	}
	slices.SortFunc(out, func(a, b *server.GpuInstance) int { return int(a.Info.Id) - int(b.Info.Id) })
	return out
}

// placedLocked lists the GPU's instances as the model's rules see them.
func (d *gpu) placedLocked() []model.Placed {
	var out []model.Placed
	for gi := range d.GpuInstances {
		q, _ := d.model.ProfileByID(gi.Info.ProfileId)
		out = append(out, model.Placed{Profile: q, Placement: gi.Info.Placement})
	}
	return out
}

// remainingLocked is how many more instances of p fit, placing them
// greedily on the first free placements.
func (d *gpu) remainingLocked(p model.MIGProfile) int {
	existing := d.placedLocked()
	n := 0
	for _, pl := range p.Placements() {
		if d.model.Fits(existing, p, pl) == nvml.SUCCESS {
			existing = append(existing, model.Placed{Profile: p, Placement: pl})
			n++
		}
	}
	return n
}

// createGI creates a GPU instance like nvmlDeviceCreateGpuInstance(WithPlacement):
//   - MIG mode not enabled: ERROR_NOT_SUPPORTED (NVML: "if device doesn't
//     have MIG mode enabled").
//   - unknown profile ID, or a placement not in the profile's list:
//     ERROR_INVALID_ARGUMENT.
//   - the profile's InstanceCount reached, the compute slices used up, or
//     the placement overlapping an existing instance:
//     ERROR_INSUFFICIENT_RESOURCES.
//
// Without a placement the first free one in the profile's list is taken.
func (d *gpu) createGI(info *nvml.GpuInstanceProfileInfo, want *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	d.Lock()
	defer d.Unlock()
	if d.migCurrent != nvml.DEVICE_MIG_ENABLE {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := d.model.ProfileByID(info.Id)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	placements := p.Placements()
	existing := d.placedLocked()
	var pl nvml.GpuInstancePlacement
	if want != nil {
		if !slices.Contains(placements, *want) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if ret := d.model.Fits(existing, p, *want); ret != nvml.SUCCESS {
			return nil, ret
		}
		pl = *want
	} else {
		i := slices.IndexFunc(placements, func(c nvml.GpuInstancePlacement) bool { return d.model.Fits(existing, p, c) == nvml.SUCCESS })
		if i < 0 {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		pl = placements[i]
	}
	// GPU instance IDs are slots the driver reuses: the lowest free one.
	id := 0
	for ; id < maxGIs; id++ {
		if !slices.ContainsFunc(d.instancesLocked(), func(gi *server.GpuInstance) bool { return int(gi.Info.Id) == id }) {
			break
		}
	}
	if id == maxGIs {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	gi, err := d.addGILocked(id, p, pl)
	if err != nil {
		return nil, nvml.ERROR_UNKNOWN
	}
	return gi, nvml.SUCCESS
}

// addGILocked makes GPU instance id of profile p at pl exist, checking
// nothing: createGI after its checks, and restoring saved state.
func (d *gpu) addGILocked(id int, p model.MIGProfile, pl nvml.GpuInstancePlacement) (*server.GpuInstance, error) {
	if err := d.tree.addInstance(d.Minor, id, -1); err != nil {
		return nil, err
	}
	gi := server.NewGpuInstanceFromInfo(nvml.GpuInstanceInfo{
		Device: d, Id: uint32(id), ProfileId: p.ID, Placement: pl,
	}, d.Config.MIGProfiles)
	d.GpuInstanceCounter++
	d.installGI(gi, p)
	d.GpuInstances[gi] = struct{}{}
	return gi, nil
}

// installGI gives a new GPU instance the hardware's refusals: destroy with
// compute instances inside or a vGPU on it is ERROR_IN_USE; compute
// instances respect their profile's placements and instance count.
func (d *gpu) installGI(gi *server.GpuInstance, p model.MIGProfile) {
	gi.DestroyFunc = func() nvml.Return {
		ret := d.destroyGI(gi)
		d.notify()
		d.changed(persist.CallDestroyGpuInstance, ret == nvml.SUCCESS)
		return ret
	}
	gi.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		ci, ret := d.createCI(gi, p, info, nil)
		d.changed(persist.CallCreateComputeInstance, ret == nvml.SUCCESS)
		return ci, ret
	}
	gi.CreateComputeInstanceWithPlacementFunc = func(info *nvml.ComputeInstanceProfileInfo, pl *nvml.ComputeInstancePlacement) (nvml.ComputeInstance, nvml.Return) {
		if pl == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		ci, ret := d.createCI(gi, p, info, pl)
		d.changed(persist.CallCreateComputeInstance, ret == nvml.SUCCESS)
		return ci, ret
	}
	d.installGIQueries(gi)
}

// destroyGI: ERROR_IN_USE while compute instances or a vGPU use it.
func (d *gpu) destroyGI(gi *server.GpuInstance) nvml.Return {
	d.Lock()
	defer d.Unlock()
	if _, ok := d.GpuInstances[gi]; !ok {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	gi.RLock()
	n := len(gi.ComputeInstances)
	gi.RUnlock()
	if n > 0 || d.hostsVGPULocked(int(gi.Info.Id)) {
		return nvml.ERROR_IN_USE
	}
	delete(d.GpuInstances, gi)
	d.tree.removeInstance(d.Minor, int(gi.Info.Id), -1)
	return nvml.SUCCESS
}

// installGIQueries answers a GPU instance's compute-instance lookups.
func (d *gpu) installGIQueries(gi *server.GpuInstance) {
	gi.GetComputeInstancesFunc = func(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
		if info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		gi.RLock()
		defer gi.RUnlock()
		var out []nvml.ComputeInstance
		for _, ci := range computeInstancesLocked(gi) {
			if ci.Info.ProfileId == info.Id {
				out = append(out, ci)
			}
		}
		return out, nvml.SUCCESS
	}
	gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
		gi.RLock()
		defer gi.RUnlock()
		for _, ci := range computeInstancesLocked(gi) {
			if int(ci.Info.Id) == id {
				return ci, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
}

func computeInstancesLocked(gi *server.GpuInstance) []*server.ComputeInstance {
	out := make([]*server.ComputeInstance, 0, len(gi.ComputeInstances))
	for ci := range gi.ComputeInstances {
		out = append(out, ci)
	}
	slices.SortFunc(out, func(a, b *server.ComputeInstance) int { return int(a.Info.Id) - int(b.Info.Id) })
	return out
}

// createCI creates a compute instance inside gi: the CI profile must exist
// for the GI profile (else ERROR_NOT_SUPPORTED), a given placement must be
// one of the profile's (else ERROR_INVALID_ARGUMENT), and the instance
// count, the GI's compute slices and overlaps are enforced
// (ERROR_INSUFFICIENT_RESOURCES).
func (d *gpu) createCI(gi *server.GpuInstance, p model.MIGProfile, info *nvml.ComputeInstanceProfileInfo, want *nvml.ComputeInstancePlacement) (nvml.ComputeInstance, nvml.Return) {
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	d.RLock()
	defer d.RUnlock()
	if _, ok := d.GpuInstances[gi]; !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	prof, ok := gi.MIGProfiles.ComputeInstanceProfiles[int(p.ID)][int(info.Id)]
	if !ok {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	placements := gi.MIGProfiles.ComputeInstancePlacements[int(p.ID)][int(info.Id)]
	gi.Lock()
	defer gi.Unlock()
	fits := func(pl nvml.ComputeInstancePlacement) bool {
		same, used := 0, 0
		for ci := range gi.ComputeInstances {
			c := ci.Info.Placement
			if c.Start < pl.Start+pl.Size && pl.Start < c.Start+c.Size {
				return false
			}
			used += int(c.Size)
			if ci.Info.ProfileId == info.Id {
				same++
			}
		}
		return same < int(prof.InstanceCount) && used+int(pl.Size) <= p.Slices
	}
	var pl nvml.ComputeInstancePlacement
	switch {
	case want != nil && !slices.Contains(placements, *want):
		return nil, nvml.ERROR_INVALID_ARGUMENT
	case want != nil && !fits(*want):
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	case want != nil:
		pl = *want
	default:
		i := slices.IndexFunc(placements, fits)
		if i < 0 {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		pl = placements[i]
	}
	// Compute instance IDs, like GPU instance IDs, are reused slots.
	id := 0
	for ; id < maxCIs; id++ {
		if !slices.ContainsFunc(computeInstancesLocked(gi), func(ci *server.ComputeInstance) bool { return int(ci.Info.Id) == id }) {
			break
		}
	}
	if id == maxCIs {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	ci, err := d.addCILocked(gi, id, info.Id, pl, d.nextSerial.Add(1))
	if err != nil {
		return nil, nvml.ERROR_UNKNOWN
	}
	return ci, nvml.SUCCESS
}

// addCILocked makes compute instance id exist in gi (whose lock the caller
// holds), checking nothing: createCI after its checks, and restoring saved
// state. serial is its creation number (for its MIG UUID).
func (d *gpu) addCILocked(gi *server.GpuInstance, id int, profileID uint32, pl nvml.ComputeInstancePlacement, serial uint64) (*server.ComputeInstance, error) {
	if err := d.tree.addInstance(d.Minor, int(gi.Info.Id), id); err != nil {
		return nil, err
	}
	ci := server.NewComputeInstanceFromInfo(nvml.ComputeInstanceInfo{
		Device: d, GpuInstance: gi, Id: uint32(id), ProfileId: profileID, Placement: pl,
	})
	gi.ComputeInstanceCounter++
	ci.DestroyFunc = func() nvml.Return {
		ret := d.destroyCI(gi, ci)
		d.changed(persist.CallDestroyComputeInstance, ret == nvml.SUCCESS)
		return ret
	}
	gi.ComputeInstances[ci] = struct{}{}
	d.serials.Store(ci, serial)
	return ci, nil
}

func (d *gpu) destroyCI(gi *server.GpuInstance, ci *server.ComputeInstance) nvml.Return {
	gi.Lock()
	defer gi.Unlock()
	if _, ok := gi.ComputeInstances[ci]; !ok {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	delete(gi.ComputeInstances, ci)
	d.serials.Delete(ci)
	d.tree.removeInstance(d.Minor, int(gi.Info.Id), int(ci.Info.Id))
	return nvml.SUCCESS
}

// migDeviceByIndex returns the index-th MIG device (one per compute
// instance, in GI then CI ID order) like nvmlDeviceGetMigDeviceHandleByIndex.
// Its UUID is name-based on the parent UUID, the GI and CI IDs and the
// compute instance's creation number: IDs are reused slots, yet a
// re-created instance gets a new UUID as on hardware.
func (d *gpu) migDeviceByIndex(index int) (nvml.Device, nvml.Return) {
	if index < 0 || index >= d.model.ComputeSlices {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	d.RLock()
	defer d.RUnlock()
	if d.migCurrent != nvml.DEVICE_MIG_ENABLE {
		return nil, nvml.ERROR_NOT_FOUND
	}
	n := 0
	for _, gi := range d.instancesLocked() {
		gi.RLock()
		cis := computeInstancesLocked(gi)
		gi.RUnlock()
		for _, ci := range cis {
			if n == index {
				return d.migDevice(gi, ci), nvml.SUCCESS
			}
			n++
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

func (d *gpu) migDevice(gi *server.GpuInstance, ci *server.ComputeInstance) nvml.Device {
	giID, ciID := int(gi.Info.Id), int(ci.Info.Id)
	serial, _ := d.serials.Load(ci)
	id := "MIG-" + nameUUID(fmt.Appendf(nil, "%s/gi/%d/ci/%d/%v", d.UUID, giID, ciID, serial))
	p, _ := d.model.ProfileByID(gi.Info.ProfileId)
	return &mock.Device{
		GetUUIDFunc:                            func() (string, nvml.Return) { return id, nvml.SUCCESS },
		GetNameFunc:                            func() (string, nvml.Return) { return d.Config.Name + " MIG " + p.Name, nvml.SUCCESS },
		IsMigDeviceHandleFunc:                  func() (bool, nvml.Return) { return true, nvml.SUCCESS },
		GetGpuInstanceIdFunc:                   func() (int, nvml.Return) { return giID, nvml.SUCCESS },
		GetComputeInstanceIdFunc:               func() (int, nvml.Return) { return ciID, nvml.SUCCESS },
		GetDeviceHandleFromMigDeviceHandleFunc: func() (nvml.Device, nvml.Return) { return d, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: p.MemMB << 20}, nvml.SUCCESS
		},
	}
}
