// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// pool lays out one pool within the API's per-slice limits: counter sets in
// slices of their own (at most 8 each, the API forbids mixing them with
// devices), then devices in order, at most 128 per slice or 64 once a slice
// holds a device that consumes counters or carries taints. Device order is
// kept: the allocator tries slices by name and devices in order, so callers
// list preferred devices first. A device named like an earlier one is left
// out (and logged): the API server would reject its slice, and the
// scheduler would then treat the whole pool as invalid.
func pool(counterSets []resourceapi.CounterSet, devices []resourceapi.Device) resourceslice.Pool {
	var p resourceslice.Pool
	seen := make(map[string]bool, len(devices))
	for start := 0; start < len(counterSets); start += resourceapi.ResourceSliceMaxCounterSets {
		end := min(start+resourceapi.ResourceSliceMaxCounterSets, len(counterSets))
		p.Slices = append(p.Slices, resourceslice.Slice{SharedCounters: counterSets[start:end]})
	}
	cur := -1 // index of the device slice being filled
	limit := resourceapi.ResourceSliceMaxDevices
	for _, d := range devices {
		if seen[d.Name] {
			klog.Background().Error(nil, "Device name built twice: publishing the first device only (a bug: please report it)", "device", d.Name)
			continue
		}
		seen[d.Name] = true
		advanced := len(d.ConsumesCounters) > 0 || len(d.Taints) > 0
		if cur >= 0 {
			n := len(p.Slices[cur].Devices)
			if n >= limit || advanced && n >= resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
				cur = -1
			}
		}
		if cur < 0 {
			p.Slices = append(p.Slices, resourceslice.Slice{})
			cur = len(p.Slices) - 1
			limit = resourceapi.ResourceSliceMaxDevices
		}
		if advanced {
			limit = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
		}
		p.Slices[cur].Devices = append(p.Slices[cur].Devices, d)
	}
	if len(p.Slices) == 0 {
		// An empty pool still tells the scheduler the driver is up.
		p.Slices = []resourceslice.Slice{{}}
	}
	return p
}
