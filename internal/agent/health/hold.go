// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"slices"
	"strings"

	"github.com/hwdra/hwdra/internal/hw"
)

// Hold keeps what the hardware said last where a probe could not tell:
// a GPU that did not answer stays in the inventory as it last answered
// (so its devices stay published, tainted, and claims on them can still
// be unprepared), and a PF whose link speed is unknown now keeps the last
// one seen as LastSpeedMbps (so its bandwidth capacity stays). Pure: prev
// is the last held inventory, cur the new probe.
func Hold(prev, cur hw.Inventory) hw.Inventory {
	out := cur
	out.GPUs = slices.Clone(cur.GPUs)
	for _, u := range cur.UnreadableGPUs {
		i := slices.IndexFunc(prev.GPUs, func(g hw.GPU) bool {
			if u.PCIBusID != "" {
				return g.PCIBusID == u.PCIBusID
			}
			return g.Index == u.Index
		})
		if i < 0 || slices.ContainsFunc(out.GPUs, func(g hw.GPU) bool { return g.PCIBusID == prev.GPUs[i].PCIBusID }) {
			continue
		}
		out.GPUs = append(out.GPUs, prev.GPUs[i])
	}
	slices.SortFunc(out.GPUs, func(a, b hw.GPU) int { return strings.Compare(a.PCIBusID, b.PCIBusID) })

	out.PFs = slices.Clone(cur.PFs)
	for i := range out.PFs {
		pf := &out.PFs[i]
		if pf.SpeedMbps > 0 {
			continue
		}
		j := slices.IndexFunc(prev.PFs, func(p hw.PF) bool { return p.PCIAddress == pf.PCIAddress })
		if j < 0 {
			continue
		}
		if p := prev.PFs[j]; p.SpeedMbps > 0 {
			pf.LastSpeedMbps = p.SpeedMbps
		} else {
			pf.LastSpeedMbps = p.LastSpeedMbps
		}
	}
	return out
}
