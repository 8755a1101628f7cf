// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/hw"
)

// healthFuncs is a Health made of functions, each optional: a test sets
// the side it watches.
type healthFuncs struct {
	faults    func() hw.Health
	probed    func(hw.Inventory) hw.Inventory
	published func(driver string, res resourceslice.DriverResources, inv hw.Inventory, f device.Features)
}

func (h healthFuncs) Faults() hw.Health {
	if h.faults == nil {
		return hw.Health{}
	}
	return h.faults()
}

func (h healthFuncs) Probed(inv hw.Inventory) hw.Inventory {
	if h.probed == nil {
		return inv
	}
	return h.probed(inv)
}

func (h healthFuncs) Published(driver string, res resourceslice.DriverResources, inv hw.Inventory, f device.Features) {
	if h.published != nil {
		h.published(driver, res, inv, f)
	}
}

type devicePluginFunc func() []string

func (f devicePluginFunc) Why() []string { return f() }

type unclaimedFunc func(probe func() (hw.Inventory, error)) (hw.Inventory, error)

func (f unclaimedFunc) Unclaimed(probe func() (hw.Inventory, error)) (hw.Inventory, error) {
	return f(probe)
}
