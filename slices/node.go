package slices

import (
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/config"
	"github.com/hwdra/hwdra/hw"
)

// Resources is what a node publishes, by driver name. A driver is present
// exactly when the node has its kind of hardware, even if none of it is
// offered right now (an empty pool tells the scheduler the driver is up).
type Resources map[string]resourceslice.DriverResources

// ForNode is the one place that decides what a node publishes: the CLI
// prints it and the agent publishes it. Devices on hardware at fault in
// faults (the health monitors' findings) are tainted as cfg says.
func ForNode(nodeName string, inv hw.Inventory, cfg *config.AgentConfig, f Features, faults hw.Health) (Resources, []config.Skip) {
	res := Resources{}
	h := Health{Faults: faults, FatalNoExecute: cfg.HealthPolicy().FatalNoExecute}
	if len(inv.GPUs) > 0 {
		res[GPUDriver] = TaintedGPUResources(nodeName, inv.GPUs, f, h)
	}
	var skipped []config.Skip
	if len(inv.PFs) > 0 {
		offers, skips := cfg.Resolve(inv.PFs)
		nic, nicSkips := TaintedNICResources(nodeName, offers, f, h)
		res[NICDriver] = nic
		skipped = append(skips, nicSkips...)
	}
	return res, skipped
}
