// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// Restore implements prepare.Driver: it learns which GPUs, GPU instances,
// mediated devices, VFs and MPS daemons the prepared claims use. A ledger
// lost with the checkpoint (the claims rebuilt from their CDI specs) gets
// back what the records say the agent made, so that what the slices leave
// out and what unprepare restores stay right: the instances, mediated
// devices and VFs, the MIG mode a GPU had before a claim's prepare
// switched it, and the settings it had (taken to be the defaults).
func (d *Driver) Restore(ctx context.Context, owned map[types.UID]Record) {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.owners)
	clear(d.users)
	d.reconciled = true
	put := func(key string, e ledgerEntry) {
		if _, ok := d.ledger.Get(key); ok {
			return
		}
		if err := d.ledger.Put(key, e); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot record hardware state of a prepared claim in the ledger", "key", key)
		}
	}
	for uid, rec := range owned {
		for _, r := range rec.Devices {
			addUser(d.users, r.GPU, uid)
			if gi := r.GPUInstance; gi != nil {
				key := giKey(r.GPU, gi.Profile, gi.Placement)
				d.owners[key] = uid
				if gi.Created {
					at := gi.Placement
					put(key, ledgerEntry{GPU: r.GPU, Profile: gi.Profile, Placement: &at})
				}
			}
			if r.Mdev != nil {
				d.owners[mdevKey(r.Mdev.UUID)] = uid
				put(mdevKey(r.Mdev.UUID), ledgerEntry{GPU: r.GPU, Mdev: r.Mdev.UUID})
			}
			if r.VF != nil {
				d.owners[vfKey(r.VF.Address)] = uid
				put(vfKey(r.VF.Address), ledgerEntry{GPU: r.GPU, VF: r.VF.Address, VFType: r.VF.Type})
			}
			if r.MIGMode != nil {
				was := !r.MIGMode.Enabled
				put(migKey(r.GPU), ledgerEntry{GPU: r.GPU, MIGEnabled: &was})
			}
			if s := r.Sharing; s != nil {
				if s.MPS != "" {
					addUser(d.mpsUsers, s.MPS, uid)
				}
				// What the settings were before is lost with the ledger:
				// the defaults, which only the agent changes.
				if e := restoredSettings(r.GPU, s); e != nil {
					put(settingsKey(r.GPU), *e)
				}
			}
		}
	}
}

// Reclaim implements prepare.Driver: it stops the MPS daemons no claim
// uses (reclaimMPS), removes the GPU instances, mediated devices and vGPU
// VFs that the ledger says the agent made and no prepared claim owns
// (left by a crash between making and recording them, or by a checkpoint
// lost without the claims' CDI specs), and restores the MIG modes and
// settings it changed on GPUs no claim uses. What a device allocated to
// this node may use stays: the GPU instance at its placement, the
// mediated devices and VFs of a GPU with an allocated vGPU, the MIG mode
// and settings of a GPU with any allocated device, the daemon of its
// claim or of its GPU's shares. Instances the agent did not make, static MIG
// partitions, are never touched. It runs beside prepares: each entry is
// judged under its GPU's lock, against the live owners.
func (d *Driver) Reclaim(ctx context.Context, allocated prepare.Allocated) ([]string, error) {
	logger := klog.FromContext(ctx)
	mayUse := d.mayUse(allocated)
	// MPS daemons first (one may serve a MIG device), vGPUs next (a
	// MIG-backed vGPU holds its GPU instance), MIG modes and GPU settings
	// last (no instance or daemon may be left).
	kept, errs := d.reclaimMPS(ctx, allocated.Known, mayUse)
	order := func(key string) int {
		switch {
		case isMdevKey(key), isVFKey(key):
			return 0
		case isMIGKey(key), isSettingsKey(key):
			return 2
		}
		return 1
	}
	keys := d.ledger.Keys()
	slices.SortStableFunc(keys, func(a, b string) int { return order(a) - order(b) })
	for _, key := range keys {
		e, ok := d.ledger.Get(key)
		if !ok {
			continue
		}
		unlock := d.gpuLocks.Lock(e.GPU)
		d.mu.Lock()
		_, owned := d.owners[key]
		inUse := len(d.users[e.GPU]) > 0
		d.mu.Unlock()
		var err error
		switch {
		case owned:
		case !allocated.Known || mayUse[key] || (e.MIGEnabled != nil || isSettingsKey(key)) && mayUse[gpuKey(e.GPU)] || (e.Mdev != "" || e.VF != "") && mayUse[vgpuKey(e.GPU)]:
			kept = append(kept, key)
		case e.MIGEnabled != nil:
			if !inUse {
				d.restoreMIGMode(ctx, e.GPU)
			}
		case isSettingsKey(key):
			if !inUse {
				d.restoreSettings(ctx, e.GPU)
			}
		case e.VF != "":
			logger.Info("Clearing the vGPU type of a VF no claim owns", "gpu", e.GPU, "vf", e.VF, "type", e.VFType)
			if err = d.clearVF(e.VF, e.VFType); err == nil {
				err = d.ledger.Delete(key)
			}
		case e.Mdev != "":
			logger.Info("Removing a vGPU mediated device no claim owns", "gpu", e.GPU, "mdev", e.Mdev)
			if err = d.mdevs.Remove(e.Mdev); err == nil {
				err = d.ledger.Delete(key)
			}
		case e.Placement != nil:
			logger.Info("Destroying a GPU instance the agent made that no claim owns", "gpu", e.GPU, "profile", e.Profile, "placement", *e.Placement)
			if err = d.destroyGPUInstanceAt(e.GPU, e.Profile, *e.Placement); err == nil {
				err = d.ledger.Delete(key)
			}
		}
		unlock()
		if err != nil {
			// On real hardware a running process refuses (IN_USE): kept
			// and tried again.
			kept = append(kept, key)
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
		}
	}
	return kept, errors.Join(errs...)
}

// mayUse is the ledger state and MPS daemons that the devices allocated
// to this node (and not prepared here) may use: keyed as the ledger keys
// GPU instances (giKey), plus gpuKey for a GPU with any such device,
// vgpuKey for one with a vGPU, mpsClaimKey for each device's claim and
// mpsShareKey for a GPU with a share.
func (d *Driver) mayUse(allocated prepare.Allocated) map[string]bool {
	out := map[string]bool{}
	if len(allocated.Devices) == 0 {
		return out
	}
	catalog := d.catalog()
	for _, a := range allocated.Devices {
		dev, ok := catalog[a.Device]
		if !ok {
			continue
		}
		bus := dev.PCIBusID()
		out[gpuKey(bus)] = true
		out[mpsClaimKey(string(a.Claim))] = true
		if dev.Kind == device.KindShare {
			out[mpsShareKey(bus)] = true
		}
		if dev.Kind == device.KindVGPU {
			out[vgpuKey(bus)] = true
		}
		if dev.Placement.Size > 0 {
			out[giKey(bus, dev.Profile.ID, dev.Placement)] = true
		}
	}
	return out
}

// reclaimMPS stops the MPS daemons no prepared claim uses and no claim
// allocated to the node may use (everything is kept while that is not
// known); it returns those it keeps for a claim that is not prepared
// (mpsKey). Each is judged under its GPUs' locks, against the live
// users.
func (d *Driver) reclaimMPS(ctx context.Context, known bool, mayUse map[string]bool) (kept []string, errs []error) {
	for _, id := range d.mps.IDs() {
		s, ok := d.mps.Spec(id)
		if !ok {
			continue
		}
		var gpus []string
		for _, ref := range s.Serves {
			gpus = append(gpus, ref.GPU)
		}
		unlock := d.gpuLocks.Lock(gpus...)
		d.mu.Lock()
		used := len(d.mpsUsers[id]) > 0
		d.mu.Unlock()
		may := mayUse[mpsClaimKey(s.Owner)]
		if s.Owner == mps.OwnerShares && len(gpus) > 0 {
			may = mayUse[mpsShareKey(gpus[0])]
		}
		switch {
		case used:
		case !known || may:
			kept = append(kept, mpsKey(id))
		default:
			klog.FromContext(ctx).Info("Stopping an MPS control daemon no claim uses", "daemon", id, "devices", s.Devices)
			if err := d.mps.Stop(ctx, id); err != nil {
				kept = append(kept, mpsKey(id))
				errs = append(errs, fmt.Errorf("MPS daemon %s: %w", id, err))
			}
		}
		unlock()
	}
	return kept, errs
}
