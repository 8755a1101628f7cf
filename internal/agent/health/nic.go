// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/hw"
)

// NICMonitor keeps the faults of the node's PFs and VFs: a link that is
// down or of unknown speed (hw.PF.LinkFault), a PF netdev that is gone, a
// VF whose PCI function is gone. It reads sysfs on every netlink link
// event of the PFs' and VFs' netdevs (carrier lost, link removed, speed
// change), on its periodic check, and takes the agent's probes. A link
// speed that changed is no fault, but the slices must say it (bandwidth
// capacity): notify is called then too.
type NICMonitor struct {
	sysfs    string
	links    *LinkSource // nil: no netlink, checks only
	interval time.Duration
	notify   func()

	mu        sync.Mutex
	pfs       []hw.PF // as last probed
	byNetdev  map[string]bool
	health    hw.Health // PFs and VFs
	speeds    map[string]int
	lastCheck time.Time
	checkNow  chan struct{}
}

// LinkSource is where the netdevs' link events come from: the path of the
// network namespace holding them ("" the agent's own).
type LinkSource struct {
	Netns string
}

// NewNICMonitor checks the netdevs under sysfs root (the mock's tree on
// mock hardware) and, with links, listens to their netlink events.
func NewNICMonitor(sysfs string, links *LinkSource, interval time.Duration, notify func()) *NICMonitor {
	return &NICMonitor{sysfs: sysfs, links: links, interval: interval, notify: notify,
		byNetdev: map[string]bool{}, speeds: map[string]int{}, checkNow: make(chan struct{}, 1)}
}

// Run watches links and checks them until ctx ends. Without netlink (not
// permitted, say) the periodic checks carry on alone.
func (m *NICMonitor) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("nic-health")
	if m.links == nil {
		logger.Info("No netlink events for these netdevs: periodic checks only", "interval", m.interval)
	} else if err := m.subscribe(ctx); err != nil {
		logger.Error(err, "Cannot watch NIC links: relying on periodic checks", "interval", m.interval)
	}
	m.check(logger)
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.checkNow:
		}
		m.check(logger)
	}
}

func (m *NICMonitor) subscribe(ctx context.Context) error {
	updates := make(chan netlink.LinkUpdate, 64)
	opts := netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) { klog.FromContext(ctx).Error(err, "Watching NIC links") },
	}
	if m.links.Netns != "" {
		ns, err := netns.GetFromPath(m.links.Netns)
		if err != nil {
			return err
		}
		defer ns.Close() // the subscription keeps its own socket
		opts.Namespace = &ns
	}
	if err := netlink.LinkSubscribeWithOptions(updates, ctx.Done(), opts); err != nil {
		return err
	}
	go func() {
		for u := range updates {
			m.mu.Lock()
			ours := m.byNetdev[u.Attrs().Name]
			m.mu.Unlock()
			if ours {
				select {
				case m.checkNow <- struct{}{}:
				default: // a check is due already
				}
			}
		}
	}()
	return nil
}

// check reads every PF's link and every VF's presence.
func (m *NICMonitor) check(logger klog.Logger) {
	m.mu.Lock()
	pfs := m.pfs
	m.mu.Unlock()
	h := hw.Health{}
	speeds := map[string]int{}
	for _, pf := range pfs {
		now, err := sriov.Link(m.sysfs, pf)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			addFault(&h.PFs, pf.PCIAddress, hw.Fault{Reason: "LinkRemoved",
				Message: "PF " + pf.PCIAddress + ": its netdev " + pf.Netdev + " is gone"})
			continue
		case err != nil:
			logger.Error(err, "Reading a PF's link", "pf", pf.PCIAddress)
		}
		if f, ok := now.LinkFault(); ok {
			addFault(&h.PFs, pf.PCIAddress, f)
		}
		speeds[pf.PCIAddress] = now.SpeedMbps
		for _, vf := range pf.VFs {
			if !sriov.VFPresent(m.sysfs, vf.PCIAddress) {
				addFault(&h.VFs, vf.PCIAddress, hw.Fault{Reason: "VFGone",
					Message: "VF " + vf.PCIAddress + " of PF " + pf.PCIAddress + " is gone (sriov_numvfs changed?)"})
			}
		}
	}
	m.set(h, speeds, true)
}

func addFault(m *map[string]hw.Fault, key string, f hw.Fault) {
	if *m == nil {
		*m = map[string]hw.Fault{}
	}
	(*m)[key] = f
}

// set stores the faults and speeds found and notifies on change.
func (m *NICMonitor) set(h hw.Health, speeds map[string]int, checked bool) {
	m.mu.Lock()
	changed := !maps.Equal(m.health.PFs, h.PFs) || !maps.Equal(m.health.VFs, h.VFs) || !maps.Equal(m.speeds, speeds)
	m.health, m.speeds = h, speeds
	if checked {
		m.lastCheck = time.Now()
	}
	m.mu.Unlock()
	if changed {
		m.notify()
	}
}

// Probed takes a probe's PFs: the ones to watch, and their link state.
func (m *NICMonitor) Probed(inv hw.Inventory) {
	h := hw.Health{}
	speeds := map[string]int{}
	byNetdev := map[string]bool{}
	for _, pf := range inv.PFs {
		if f, ok := pf.LinkFault(); ok {
			addFault(&h.PFs, pf.PCIAddress, f)
		}
		speeds[pf.PCIAddress] = pf.SpeedMbps
		byNetdev[pf.Netdev] = true
		for _, vf := range pf.VFs {
			if vf.Netdev != "" {
				byNetdev[vf.Netdev] = true
			}
		}
	}
	m.mu.Lock()
	m.pfs, m.byNetdev = inv.PFs, byNetdev
	// A VF or netdev found gone between probes stays so until a probe
	// no longer lists it.
	for vf, f := range m.health.VFs {
		if present(inv.PFs, vf) {
			addFault(&h.VFs, vf, f)
		}
	}
	m.mu.Unlock()
	m.set(h, speeds, false)
}

func present(pfs []hw.PF, vf string) bool {
	for _, pf := range pfs {
		for _, v := range pf.VFs {
			if v.PCIAddress == vf {
				return true
			}
		}
	}
	return false
}

// Faults returns the PFs' and VFs' faults.
func (m *NICMonitor) Faults() hw.Health {
	m.mu.Lock()
	defer m.mu.Unlock()
	return hw.Health{PFs: m.health.PFs, VFs: m.health.VFs}
}

// LastCheck is when the monitor last completed a check (zero: none yet).
func (m *NICMonitor) LastCheck() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastCheck
}
