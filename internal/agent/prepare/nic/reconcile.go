// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/prepare"
)

// Restore implements prepare.Driver: it rebuilds the reservations from the
// prepared claims' records.
func (d *Driver) Restore(_ context.Context, owned map[types.UID]Record) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.held = map[string]types.UID{}
	for uid, rec := range owned {
		for _, v := range rec.VFs {
			d.held[v.PCIAddress] = uid
		}
	}
}

// Reclaim implements prepare.Driver: it restores the VFs the ledger lists
// that no claim holds, and forgets entries of an earlier boot (the reboot
// reset those VFs). A VF whose ledger entry names a claim still allocated
// to this node (its record lost with the checkpoint) is kept as it is, and
// so is every VF while the API server cannot say. A VF that cannot be
// restored is logged and kept for the next round; only a ledger that
// cannot be written is an error.
func (d *Driver) Reclaim(ctx context.Context, allocated prepare.Allocated) ([]string, error) {
	logger := klog.FromContext(ctx)
	claims := map[types.UID]bool{}
	for _, a := range allocated.Devices {
		claims[a.Claim] = true
	}
	var kept []string
	for _, addr := range d.ledger.Keys() {
		e, ok := d.ledger.Get(addr)
		if !ok {
			continue
		}
		if e.BootID != d.opts.BootID {
			logger.Info("Forgetting VF settings recorded before the node rebooted", "vf", addr, "pf", e.PF, "index", e.Index)
			if err := d.ledger.Delete(addr); err != nil {
				return kept, err
			}
			continue
		}
		err := func() error {
			defer d.pfLocks.Lock(e.PFAddress)()
			d.mu.Lock()
			owner, held := d.held[addr]
			d.mu.Unlock()
			switch {
			case held:
				if owner != e.Claim {
					logger.Info("VF held by a claim other than the one that changed it: left as it is", "vf", addr, "holder", owner, "ledger", e.Claim)
				}
				return nil
			case !allocated.Known || claims[e.Claim]:
				kept = append(kept, addr)
				return nil
			}
			if err := d.opts.VFs.SetVF(d.currentRef(addr, e.PF, e.Index, ""), e.Original); err != nil && !d.gone(ctx, addr, err) {
				logger.Error(err, "Cannot restore a VF no prepared claim holds; tried again later", "vf", addr, "pf", e.PF, "index", e.Index)
				kept = append(kept, addr)
				return nil
			}
			logger.Info("Restored a VF no prepared claim holds", "vf", addr, "pf", e.PF, "index", e.Index, "claim", e.Claim)
			return d.ledger.Delete(addr)
		}()
		if err != nil {
			return kept, err
		}
	}
	return kept, nil
}
