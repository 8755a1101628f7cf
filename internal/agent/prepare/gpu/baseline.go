// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"slices"

	"github.com/hwdra/hwdra/internal/hw"
)

// Unclaimed probes the node and returns its GPUs as they would be without
// the partitions this agent made for claims: GPU instances from its ledger
// are left out, and a MIG mode the agent switched is shown as it was
// before. The published slices come from this view, so preparing and
// unpreparing claims never changes them: the counters already keep the
// scheduler from allocating what overlaps an allocated device. State made
// outside the agent (a static partition, a mode an administrator set)
// stays in, and the slices follow it.
//
// Prepares run while the node is probed: when the ledger changed during a
// probe, the probe is repeated (a few times), and an instance counts as
// the agent's if the ledger listed it before or after the probe.
func (d *Driver) Unclaimed(probe func() (hw.Inventory, error)) (hw.Inventory, error) {
	const attempts = 3
	for i := 0; ; i++ {
		before, v0 := d.ledger.Snapshot()
		inv, err := probe()
		after, v1 := d.ledger.Snapshot()
		if v0 != v1 && i+1 < attempts {
			continue
		}
		for k, e := range before {
			if _, ok := after[k]; !ok {
				after[k] = e
			}
		}
		inv.GPUs = unclaimed(inv.GPUs, after)
		return inv, err
	}
}

// unclaimed is Unclaimed's pure part: gpus without what ledger lists.
func unclaimed(gpus []hw.GPU, ledger map[string]ledgerEntry) []hw.GPU {
	out := make([]hw.GPU, len(gpus))
	for i, g := range gpus {
		out[i] = g
		instances := slices.DeleteFunc(slices.Clone(g.MIG.Instances), func(in hw.GPUInstance) bool {
			_, ours := ledger[giKey(g.PCIBusID, in.ProfileID, in.Placement)]
			return ours
		})
		if len(instances) == len(g.MIG.Instances) && ledger[migKey(g.PCIBusID)].MIGEnabled == nil {
			continue // nothing of ours: keep the slice as probed
		}
		if len(instances) == 0 {
			instances = nil // as a probe of a GPU without instances says
		}
		out[i].MIG.Instances = instances
		// The mode the agent switched from, unless someone else's
		// instances now need the mode as it is.
		if e := ledger[migKey(g.PCIBusID)]; e.MIGEnabled != nil && len(instances) == 0 {
			out[i].MIG.Enabled, out[i].MIG.Pending = *e.MIGEnabled, *e.MIGEnabled
		}
	}
	return out
}
