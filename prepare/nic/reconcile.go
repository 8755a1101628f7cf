package nic

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Reconcile implements prepare.Driver: it rebuilds the reservations from
// the prepared claims' records and restores the VFs the ledger lists that
// no prepared claim holds. A VF that cannot be restored is logged and
// kept in the ledger for the next start; only a ledger that cannot be
// written fails the start.
func (d *Driver) Reconcile(ctx context.Context, owned map[types.UID]Record) error {
	d.mu.Lock()
	d.held = map[string]types.UID{}
	for uid, rec := range owned {
		for _, v := range rec.VFs {
			d.held[v.PCIAddress] = uid
		}
	}
	held := d.heldLocked()
	d.mu.Unlock()
	return d.reclaim(ctx, held)
}

// reclaim restores the VFs the ledger lists that no claim holds, and
// forgets entries of an earlier boot (the reboot reset those VFs).
func (d *Driver) reclaim(ctx context.Context, held map[string]types.UID) error {
	logger := klog.FromContext(ctx)
	for _, addr := range d.ledger.Keys() {
		e, ok := d.ledger.Get(addr)
		if !ok {
			continue
		}
		if e.BootID != d.opts.BootID {
			logger.Info("Forgetting VF settings recorded before the node rebooted", "vf", addr, "pf", e.PF, "index", e.Index)
			if err := d.ledger.Delete(addr); err != nil {
				return err
			}
			continue
		}
		if owner, ok := held[addr]; ok {
			if owner != e.Claim {
				logger.Info("VF held by a claim other than the one that changed it: left as it is", "vf", addr, "holder", owner, "ledger", e.Claim)
			}
			continue
		}
		if err := d.opts.VFs.SetVF(d.currentRef(addr, e.PF, e.Index, ""), e.Original); err != nil && !d.gone(ctx, addr, err) {
			logger.Error(err, "Cannot restore a VF no prepared claim holds; it stays in the ledger for the next start", "vf", addr, "pf", e.PF, "index", e.Index)
			continue
		}
		logger.Info("Restored a VF no prepared claim holds", "vf", addr, "pf", e.PF, "index", e.Index, "claim", e.Claim)
		if err := d.ledger.Delete(addr); err != nil {
			return err
		}
	}
	return nil
}
