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
// prints it and the agent publishes it.
func ForNode(nodeName string, inv hw.Inventory, cfg *config.AgentConfig, f Features) (Resources, []config.Skip) {
	res := Resources{}
	if len(inv.GPUs) > 0 {
		res[GPUDriver] = GPUResources(nodeName, inv.GPUs, f)
	}
	var skipped []config.Skip
	if len(inv.PFs) > 0 {
		offers, skips := cfg.Resolve(inv.PFs)
		nic, nicSkips := NICResources(nodeName, offers, f)
		res[NICDriver] = nic
		skipped = append(skips, nicSkips...)
	}
	return res, skipped
}
