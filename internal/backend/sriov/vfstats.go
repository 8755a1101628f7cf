// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import "fmt"

// VFStats are a VF's traffic counters as its PF's driver keeps them
// (IFLA_VF_STATS: mlx5 and ice keep them; a driver that keeps none, or a
// link that is no PF, lists no VF).
type VFStats struct {
	RxBytes, TxBytes, RxPackets, TxPackets, RxDropped, TxDropped uint64
}

// VFStats reads the counters of a PF's VFs, by VF index, through the PF's
// netdev in this namespace: one netlink request (the kernel sends every
// VF's with the link).
func (n *Netns) VFStats(pf string) (map[int]VFStats, error) {
	link, err := n.nl.LinkByName(pf)
	if err != nil {
		return nil, fmt.Errorf("sriov: PF %s: %w", pf, err)
	}
	out := make(map[int]VFStats, len(link.Attrs().Vfs))
	for _, vf := range link.Attrs().Vfs {
		out[vf.ID] = VFStats{
			RxBytes: vf.RxBytes, TxBytes: vf.TxBytes, RxPackets: vf.RxPackets, TxPackets: vf.TxPackets,
			RxDropped: vf.RxDropped, TxDropped: vf.TxDropped,
		}
	}
	return out, nil
}
