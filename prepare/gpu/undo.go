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
		defer d.gpuLocks.Lock(g)()
	}
	var errs []error
	for i := len(rec.Devices) - 1; i >= 0; i-- {
		r := rec.Devices[i]
		if err := d.undo(claim, r); err != nil {
			errs = append(errs, fmt.Errorf("request %q, device %s: %w", r.Request, r.Device, err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...) // the claim still holds its GPUs
	}
	for _, g := range rec.gpus() {
		if d.release(g, claim) {
			d.restoreMIGMode(ctx, g)
		}
	}
	return nil
}

func (d *Driver) undo(claim types.UID, r DeviceRecord) error {
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

// restoreMIGMode switches a GPU that no claim uses back to the MIG mode
// it had before the agent first switched it, if the ledger says it did.
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
	clear(d.users)
	d.reconciled = true
	for uid, rec := range owned {
		for _, r := range rec.Devices {
			if d.users[r.GPU] == nil {
				d.users[r.GPU] = map[types.UID]bool{}
			}
			d.users[r.GPU][uid] = true
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
	// Mediated devices first (a MIG-backed vGPU holds its GPU instance),
	// MIG modes last (no instance may be left).
	order := func(key string) int {
		switch {
		case strings.HasPrefix(key, "mdev/"):
			return 0
		case strings.HasPrefix(key, "migmode/"):
			return 2
		}
		return 1
	}
	keys := d.ledger.Keys()
	slices.SortStableFunc(keys, func(a, b string) int { return order(a) - order(b) })
	for _, key := range keys {
		if covered[key] {
			continue
		}
		e, _ := d.ledger.Get(key)
		unlock := d.gpuLocks.Lock(e.GPU)
		var err error
		switch {
		case e.MIGEnabled != nil:
			d.mu.Lock()
			free := len(d.users[e.GPU]) == 0
			d.mu.Unlock()
			if free {
				d.restoreMIGMode(ctx, e.GPU)
			}
			unlock()
			continue
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
