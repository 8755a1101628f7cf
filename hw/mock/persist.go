package mock

import (
	"fmt"
	"time"

	"github.com/hwdra/hwdra/hw/mock/persist"
)

// start finishes New: it applies a saved state to the freshly built
// hardware (GPUs first, then the vGPUs on them, then links and VFs), then
// the directory starts saving each change and pacing the calls by the
// profile's timings.
func (h *Hardware) start(saved *persist.State) error {
	if saved != nil {
		if err := h.restore(*saved); err != nil {
			return fmt.Errorf("mock hardware in %s: restoring its saved state: %w", h.Dir(), err)
		}
	}
	return h.dir.Start(h.snapshot, h.timings())
}

func (h *Hardware) restore(s persist.State) error {
	if err := h.gpus.Restore(s); err != nil {
		return err
	}
	return h.nics.Restore(s)
}

// snapshot collects the state of every part of the node.
func (h *Hardware) snapshot() persist.State {
	var s persist.State
	h.gpus.Snapshot(&s)
	h.nics.Snapshot(&s)
	return s
}

// timings are the profile's timings by device: each group's for its GPUs
// (by PCI address) and PFs (by netdev).
func (h *Hardware) timings() map[string]map[string]time.Duration {
	out := map[string]map[string]time.Duration{}
	busIDs, netdevs := h.gpus.BusIDs(), h.nics.Netdevs()
	for _, g := range h.Profile.GPUs {
		m, _ := g.Timings.Durations() // validated with the profile
		for range g.Count {
			out[busIDs[0]], busIDs = m, busIDs[1:]
		}
	}
	for _, g := range h.Profile.NICs {
		m, _ := g.Timings.Durations()
		for range g.Count {
			if len(netdevs) > 0 {
				out[netdevs[0]], netdevs = m, netdevs[1:]
			}
		}
	}
	return out
}
