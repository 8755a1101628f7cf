// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"
)

// ByDriver is what a node publishes, by driver name. A driver is present
// exactly when the node has its kind of hardware, even if none of it is
// offered right now (an empty pool tells the scheduler the driver is up).
type ByDriver map[string]resourceslice.DriverResources

// ForNode is the one place that decides what a node publishes: the CLI
// prints it and the agent publishes it. Devices on hardware at fault in
// faults (the health monitors' findings) are tainted as cfg says, and
// GPUs offer the MIG profiles it offers, MIG partitions of a GPU with MIG
// off only where it lets the agent switch MIG mode (gpus.settings).
func ForNode(nodeName string, inv hw.Inventory, cfg *config.AgentConfig, f device.Features, faults hw.Health) (ByDriver, []config.Skip) {
	res := ByDriver{}
	h := Health{Faults: faults, FatalNoExecute: cfg.HealthPolicy().FatalNoExecute}
	if len(inv.GPUs) > 0 || len(inv.PassthroughGPUs) > 0 {
		res[device.GPUDriver] = TaintedGPU(nodeName, inv.GPUs, inv.PassthroughGPUs, f, h, cfg.GPUPolicy())
	}
	var skipped []config.Skip
	if len(inv.PFs) > 0 {
		offers, skips := cfg.Resolve(inv.PFs)
		nic, nicSkips := TaintedNIC(nodeName, offers, f, h)
		res[device.NICDriver] = nic
		skipped = append(skips, nicSkips...)
	}
	return res, skipped
}
