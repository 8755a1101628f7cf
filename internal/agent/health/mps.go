// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/hw"
)

// MPSDaemons is what the MPS monitor needs of the MPS daemons
// (mps.Manager): a check of each that starts those that are down again,
// and what each serves.
type MPSDaemons interface {
	Supervise(ctx context.Context) map[string]error
	Spec(id string) (mps.Spec, bool)
}

// MPSMonitor supervises the MPS control daemons: every interval it
// checks each, has one that is down started again, and reports the
// devices it serves unhealthy until a check finds it back.
type MPSMonitor struct {
	daemons  MPSDaemons
	interval time.Duration
	notify   func()

	mu        sync.Mutex
	faults    map[hw.MPSRef]hw.Fault
	lastCheck time.Time
}

// NewMPSMonitor returns a monitor that checks every interval and calls
// notify (which must not block) whenever the faults change.
func NewMPSMonitor(daemons MPSDaemons, interval time.Duration, notify func()) *MPSMonitor {
	return &MPSMonitor{daemons: daemons, interval: interval, notify: notify}
}

// Run checks the daemons until ctx ends.
func (m *MPSMonitor) Run(ctx context.Context) {
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		m.Check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Check checks every daemon once.
func (m *MPSMonitor) Check(ctx context.Context) {
	down := m.daemons.Supervise(ctx)
	faults := map[hw.MPSRef]hw.Fault{}
	for id, err := range down {
		s, ok := m.daemons.Spec(id)
		if !ok {
			continue
		}
		f := hw.Fault{Reason: "MPSDaemonDown", Message: fmt.Sprintf("the MPS control daemon %s serving these devices was down (%v); started again", id, err)}
		for _, ref := range s.Serves {
			// A share's daemon (the GPU's policed shares', or a
			// dedicated share's) serves the GPU's share device, not
			// the whole GPU device.
			faults[hw.MPSRef{PartitionRef: ref, Shares: s.ServesShares()}] = f
		}
	}
	m.mu.Lock()
	changed := !maps.Equal(m.faults, faults)
	m.faults, m.lastCheck = faults, time.Now()
	m.mu.Unlock()
	if changed {
		m.notify()
	}
}

// Faults are the devices of the daemons the last check found down.
func (m *MPSMonitor) Faults() map[hw.MPSRef]hw.Fault {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.faults)
}

// Probed implements the agent's monitor interface: the daemons are
// known from their records, not from the probe.
func (m *MPSMonitor) Probed(hw.Inventory) {}

// Alive reports whether the monitor completed a check within d.
func (m *MPSMonitor) Alive(d time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Since(m.lastCheck) <= d
}
