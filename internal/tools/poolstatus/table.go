// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package poolstatus

import (
	"cmp"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	resourcealpha "k8s.io/api/resource/v1alpha3"
)

// WriteTable writes the report for people: one line per pool, then per
// pool its GPUs' profiles and its shared devices' capacities.
func WriteTable(w io.Writer, r Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(cells ...any) {
		s := make([]string, len(cells))
		for i, c := range cells {
			s[i] = fmt.Sprint(c)
		}
		fmt.Fprintln(tw, strings.Join(s, "\t"))
	}
	if len(r.Pools) == 0 {
		fmt.Fprintln(tw, "No pools.")
		return tw.Flush()
	}
	row("DRIVER", "POOL", "NODE", "GENERATION", "SLICES", "TOTAL", "ALLOCATED", "AVAILABLE", "UNAVAILABLE")
	for _, p := range r.Pools {
		row(p.Driver, p.PoolName, str(p.NodeName), p.Generation, num(p.ResourceSliceCount),
			num(p.TotalDevices), num(p.AllocatedDevices), num(p.AvailableDevices), num(p.UnavailableDevices))
	}
	for _, p := range r.Pools {
		if p.ValidationError == nil && len(p.GPUs) == 0 && p.ShareableSummary == nil && len(p.SharedDevices) == 0 {
			continue
		}
		fmt.Fprintf(tw, "\n%s pool %s\n", p.Driver, p.PoolName)
		if p.ValidationError != nil {
			fmt.Fprintf(tw, "validation error: %s\n", *p.ValidationError)
		}
		if len(p.GPUs) > 0 {
			row("GPU", "PROFILE", "DEVICES", "ALLOCATED", "UNAVAILABLE", "ALLOCATABLE")
			for _, g := range p.GPUs {
				for i, pr := range g.Profiles {
					bus := g.PCIBusID
					if i > 0 {
						bus = ""
					}
					row(bus, pr.Profile, pr.Devices, pr.Allocated, pr.Unavailable, pr.Allocatable)
				}
			}
		}
		if len(p.SharedDevices) > 0 || p.ShareableSummary != nil {
			row("SHARED DEVICE", "PF/GPU", "ALLOCATIONS", "UNAVAILABLE", "CAPACITY", "TOTAL", "CONSUMED", "AVAILABLE")
			for _, d := range p.SharedDevices {
				capacityRows(row, []any{d.Device, cmp.Or(d.PFName, d.GPU), d.Allocations, unavailableCell(d)}, d.Capacity)
			}
			if s := p.ShareableSummary; s != nil {
				capacityRows(row, []any{"(pool)", "", "", ""}, s.Capacity)
				fmt.Fprintf(tw, "shared devices: %s fully available, %s partly\n", num(s.FullyAvailableDevices), num(s.PartiallyAvailableDevices))
			}
		}
	}
	return tw.Flush()
}

// capacityRows writes one row per capacity, the leading cells on the first.
func capacityRows(row func(...any), lead []any, caps []resourcealpha.ShareableCapacityStatus) {
	blank := make([]any, len(lead))
	for i := range blank {
		blank[i] = ""
	}
	if len(caps) == 0 {
		row(append(lead, "", "", "", "")...)
	}
	for i, c := range caps {
		cells := blank
		if i == 0 {
			cells = lead
		}
		row(append(append([]any(nil), cells...), c.Name, c.Total.String(), c.Consumed.String(), c.Available.String())...)
	}
}

// unavailableCell says whether new shares can land on the device, and why
// not: a taint, or the GPU's other devices holding its counters.
func unavailableCell(d SharedDevice) string {
	switch {
	case d.Unavailable:
		return "yes"
	case d.Held:
		return "held"
	}
	return "no"
}

func num(p *int32) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

func str(p *string) string {
	if p == nil {
		return "-"
	}
	return *p
}
