package gpu

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/hw"
	"github.com/hwdra/hwdra/nvml"
)

// Unprepare implements prepare.Driver: it undoes a record's side effects
// in reverse order. Each is found by its intent, so it works whether the
// side effect happened, never happened, or was undone before; it goes on
// after a failure and reports all of them.
func (d *Driver) Unprepare(ctx context.Context, claim types.UID, rec Record) error {
	for _, g := range rec.gpus() {
		defer d.gpuLocks.lock(g)()
	}
	var errs []error
	for i := len(rec.Devices) - 1; i >= 0; i-- {
		r := rec.Devices[i]
		if err := d.undo(ctx, claim, r); err != nil {
			errs = append(errs, fmt.Errorf("request %q, device %s: %w", r.Request, r.Device, err))
		}
	}
	return errors.Join(errs...)
}

func (d *Driver) undo(ctx context.Context, claim types.UID, r DeviceRecord) error {
	if m := r.Mdev; m != nil {
		if err := d.mdevs.Remove(m.UUID); err != nil {
			return err
		}
		if err := d.ledger.Delete(mdevKey(m.UUID)); err != nil {
			return err
		}
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
	if m := r.MIGMode; m != nil {
		d.restoreMIGMode(ctx, r.GPU, !m.Enabled)
	}
	return nil
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

// restoreMIGMode switches MIG mode back to what it was before a prepare,
// once no GPU instance is left (other claims' partitions keep it on). It
// is best effort: the slices offer both modes on a GPU that can switch,
// so a mode left over only costs the next prepare a switch; failing
// unprepare for it would block the pod's teardown for nothing.
func (d *Driver) restoreMIGMode(ctx context.Context, gpu string, enabled bool) {
	logger := klog.FromContext(ctx)
	on, err := d.nvml.MIGEnabled(gpu)
	if err == nil && on == enabled {
		return
	}
	if err == nil && on {
		var list []hw.GPUInstance
		if list, err = d.nvml.GPUInstances(gpu); err == nil && len(list) > 0 {
			return
		}
	}
	if err == nil {
		err = d.nvml.SetMIGMode(gpu, enabled)
	}
	if err != nil {
		logger.Error(err, "Could not restore the GPU's MIG mode; left as it is", "gpu", gpu, "migMode", onOff(enabled))
	}
}

// Reconcile implements prepare.Driver: it learns which GPU instances the
// prepared claims use, and removes the GPU instances and mediated devices
// that the ledger says the agent made but no prepared claim owns (left by
// a crash between creating them and recording the claim). Instances the
// agent did not make, static MIG partitions, are never touched.
func (d *Driver) Reconcile(ctx context.Context, owned map[types.UID]Record) error {
	logger := klog.FromContext(ctx)
	covered := map[string]bool{}
	d.mu.Lock()
	clear(d.owners)
	for uid, rec := range owned {
		for _, r := range rec.Devices {
			if gi := r.GPUInstance; gi != nil {
				key := giKey(r.GPU, gi.Profile, gi.Placement)
				d.owners[key] = uid
				covered[key] = true
			}
			if r.Mdev != nil {
				covered[mdevKey(r.Mdev.UUID)] = true
			}
		}
	}
	d.mu.Unlock()
	var errs []error
	// Mediated devices first: a MIG-backed vGPU holds its GPU instance.
	keys := d.ledger.Keys()
	slices.SortStableFunc(keys, func(a, b string) int {
		return boolInt(!strings.HasPrefix(a, "mdev/")) - boolInt(!strings.HasPrefix(b, "mdev/"))
	})
	for _, key := range keys {
		if covered[key] {
			continue
		}
		e, _ := d.ledger.Get(key)
		unlock := d.gpuLocks.lock(e.GPU)
		var err error
		switch {
		case e.Mdev != "":
			logger.Info("Removing a vGPU mediated device no prepared claim owns", "gpu", e.GPU, "mdev", e.Mdev)
			err = d.mdevs.Remove(e.Mdev)
		case e.Placement != nil:
			logger.Info("Destroying a GPU instance the agent made that no prepared claim owns", "gpu", e.GPU, "profile", e.Profile, "placement", *e.Placement)
			err = d.destroyGPUInstanceAt(e.GPU, e.Profile, *e.Placement)
		}
		unlock()
		if err == nil {
			err = d.ledger.Delete(key)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
