// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/hw"
)

// Unprepare implements prepare.Driver: it undoes a record's side effects
// in reverse order. Each is found by its intent, so it works whether the
// side effect happened, never happened, or was undone before; it goes on
// after a failure and reports all of them.
func (d *Driver) Unprepare(ctx context.Context, claim types.UID, rec Record) error {
	for _, g := range rec.gpus() {
		defer d.gpuLocks.Lock(g)()
	}
	var errs []error
	for i := len(rec.Devices) - 1; i >= 0; i-- {
		r := rec.Devices[i]
		if err := d.undo(ctx, claim, r); err != nil {
			errs = append(errs, fmt.Errorf("request %q, device %s: %w", r.Request, r.Device, err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...) // the claim still holds its GPUs
	}
	// A GPU's settings come back only when no claim uses it: a GPU left
	// in compute mode Default by a dedicated share that went stays so
	// while policed shares remain (switching it under their running
	// server is not worth the risk), and is restored with the last.
	for _, g := range rec.gpus() {
		if d.release(g, claim) {
			d.restoreMIGMode(ctx, g)
			d.restoreSettings(ctx, g)
		}
	}
	return nil
}

func (d *Driver) undo(ctx context.Context, claim types.UID, r DeviceRecord) error {
	// The MPS daemon first: it may serve a MIG device destroyed below.
	// It stops with its last claim.
	if s := r.Sharing; s != nil && s.MPS != "" && d.releaseMPS(s.MPS, claim) {
		if err := d.mps.Stop(ctx, s.MPS); err != nil {
			return err
		}
	}
	if vf := r.VF; vf != nil {
		if err := d.clearVF(vf.Address, vf.Type); err != nil {
			return err
		}
		if err := d.ledger.Delete(vfKey(vf.Address)); err != nil {
			return err
		}
		d.disown(vfKey(vf.Address), claim)
	}
	if m := r.Mdev; m != nil {
		if err := d.mdevs.Remove(m.UUID); err != nil {
			return err
		}
		if err := d.ledger.Delete(mdevKey(m.UUID)); err != nil {
			return err
		}
		d.disown(mdevKey(m.UUID), claim)
	}
	if ci := r.ComputeInstance; ci != nil && ci.Created {
		if err := d.destroyComputeInstance(r.GPU, ci); err != nil {
			return err
		}
	}
	if gi := r.GPUInstance; gi != nil {
		key := giKey(r.GPU, gi.Profile, gi.Placement)
		if gi.Created {
			if err := d.destroyGPUInstanceAt(r.GPU, gi.Profile, gi.Placement); err != nil {
				return err
			}
			if err := d.ledger.Delete(key); err != nil {
				return err
			}
		}
		d.disown(key, claim)
	}
	return nil
}

// clearVF makes a VF no vGPU if it is one of the type the agent made it:
// a VF that is none (the write never happened, or was undone) or of
// another type (not the agent's doing) is left alone.
func (d *Driver) clearVF(vf string, typ uint) error {
	cur, err := d.vfs.Current(vf)
	if errors.Is(err, fs.ErrNotExist) || err == nil && cur != typ {
		return nil
	}
	if err != nil {
		return err
	}
	return d.vfs.Clear(vf)
}

func (d *Driver) destroyComputeInstance(gpu string, ci *ComputeInstanceRecord) error {
	if ci.ID != nil {
		if err := d.nvml.DestroyComputeInstance(gpu, ci.GPUInstance, *ci.ID); err != nil && !errors.Is(err, nvml.ErrNotFound) {
			return err
		}
		return nil
	}
	// Only the intent was recorded: destroy the compute instances of the
	// GPU instance that were not there before.
	list, err := d.nvml.GPUInstances(gpu)
	if err != nil {
		return err
	}
	for _, gi := range list {
		if gi.ID != ci.GPUInstance {
			continue
		}
		for _, c := range gi.ComputeInstances {
			if slices.Contains(ci.Existing, c.ID) {
				continue
			}
			if err := d.nvml.DestroyComputeInstance(gpu, gi.ID, c.ID); err != nil && !errors.Is(err, nvml.ErrNotFound) {
				return err
			}
		}
	}
	return nil
}

// destroyGPUInstanceAt destroys the GPU instance of a profile exactly at a
// placement, with its compute instances, if there is one.
func (d *Driver) destroyGPUInstanceAt(gpu string, profile int, at hw.Placement) error {
	list, err := d.nvml.GPUInstances(gpu)
	if err != nil {
		return err
	}
	for _, gi := range list {
		if gi.ProfileID != profile || gi.Placement != at {
			continue
		}
		for _, c := range gi.ComputeInstances {
			if err := d.nvml.DestroyComputeInstance(gpu, gi.ID, c.ID); err != nil && !errors.Is(err, nvml.ErrNotFound) {
				return err
			}
		}
		if err := d.nvml.DestroyGPUInstance(gpu, gi.ID); err != nil && !errors.Is(err, nvml.ErrNotFound) {
			return err
		}
	}
	return nil
}

// restoreMIGMode switches a GPU that no claim uses back to the MIG mode
// it had before the agent first switched it, if the ledger says it did.
// It does so under gpus.settings Leave too: such an entry is left from
// before the switch to Leave (under Leave none is written), and restoring
// it undoes the agent's own change, giving the GPU back in the mode the
// operator had it in (which is also the mode the slices show it in).
// It is best effort: the slices offer both modes on a GPU that switches
// without a reset, so a mode left over only costs the next prepare a
// switch, and failing unprepare for it would block the pod's teardown for
// nothing. The ledger entry stays until it succeeds.
func (d *Driver) restoreMIGMode(ctx context.Context, gpu string) {
	e, ok := d.ledger.Get(migKey(gpu))
	if !ok || e.MIGEnabled == nil {
		return
	}
	want := *e.MIGEnabled
	on, err := d.nvml.MIGEnabled(gpu)
	if err == nil && on != want {
		err = d.nvml.SetMIGMode(gpu, want)
	}
	if err == nil {
		err = d.ledger.Delete(migKey(gpu))
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Could not restore the GPU's MIG mode; left as it is", "gpu", gpu, "migMode", onOff(want))
	}
}

// restoreSettings gives a GPU that no claim uses back the compute mode
// and time slice it had before the agent changed them, under
// gpus.settings Leave too (as restoreMIGMode). Like the MIG mode it is
// best effort, the entry kept (and tried again by Reclaim) until it
// succeeds: a setting left over costs the next claim only its timing,
// and failing unprepare for it would block the pod's teardown.
func (d *Driver) restoreSettings(ctx context.Context, gpu string) {
	e, ok := d.ledger.Get(settingsKey(gpu))
	if !ok {
		return
	}
	var err error
	if e.TimeSlice != nil {
		err = d.programs.SetTimeSlice(ctx, d.uuidOf(gpu), *e.TimeSlice)
	}
	if err == nil && e.ComputeMode != "" {
		err = d.nvml.SetComputeMode(gpu, e.ComputeMode)
	}
	if err == nil {
		err = d.ledger.Delete(settingsKey(gpu))
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Could not restore the GPU's compute mode and time slice; left as they are", "gpu", gpu)
	}
}
