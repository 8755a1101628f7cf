// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podmetrics

import (
	"maps"
	"slices"
)

// vfCounters: each prepared VF's traffic counters, one netlink read per
// PF, where the PF's driver keeps them (mlx5, ice; a veth stand-in keeps
// none).
func (c *Collector) vfCounters(out *emitter, devices []Device) {
	byPF := map[string][]Device{}
	for _, d := range devices {
		if d.VF != "" && d.PF != "" {
			byPF[d.PF] = append(byPF[d.PF], d)
		}
	}
	for _, pf := range slices.Sorted(maps.Keys(byPF)) {
		stats, err := c.o.VFStats.VFStats(pf)
		if err != nil {
			out.gauge(vfStatsUpDesc, 0, pf)
			continue
		}
		out.gauge(vfStatsUpDesc, 1, pf)
		for _, d := range byPF[pf] {
			s, ok := stats[d.VFIndex]
			if !ok {
				continue
			}
			l := []string{d.Namespace, d.Claim, d.Request, d.Pool, d.Name, d.VF}
			for _, dir := range []struct {
				name                    string
				bytes, packets, dropped uint64
			}{{"receive", s.RxBytes, s.RxPackets, s.RxDropped}, {"transmit", s.TxBytes, s.TxPackets, s.TxDropped}} {
				out.counter(vfBytesDesc, float64(dir.bytes), append(l, dir.name)...)
				out.counter(vfPacketsDesc, float64(dir.packets), append(l, dir.name)...)
				out.counter(vfDroppedDesc, float64(dir.dropped), append(l, dir.name)...)
			}
		}
	}
}
