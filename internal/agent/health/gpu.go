// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/hw"
)

// GPUSource is what the GPU monitor needs of the GPU backend
// (nvml.Backend).
type GPUSource interface {
	// WatchEvents sends the GPUs' health events until ctx ends.
	WatchEvents(ctx context.Context, out chan<- hw.GPUEvent) error
	// CheckGPUs asks every GPU whether it answers and what recovery
	// action its driver asks for.
	CheckGPUs(ctx context.Context) ([]hw.GPUCheck, error)
}

// GPUMonitor keeps the faults of the node's GPUs, from three inputs: NVML
// events (XIDs, double-bit ECC, a GPU unavailable, recovery actions), its
// periodic checks, and the agent's probes (GPUs that did not answer).
//
// An XID is a device failure unless XIDPolicy ignores it. Where the
// driver reports NVML's GPU recovery action, it decides: an XID after
// which the driver asks for no action is no failure, and the GPU recovers
// when the driver's action returns to none (after a reset). Where it does
// not, the XID's number decides and the fault stays until the GPU is seen
// coming back from the bus or the agent restarts: nothing else tells that
// a GPU was reset. An event confined to a MIG GPU instance faults only the
// devices at its placement.
type GPUMonitor struct {
	src      GPUSource
	policy   XIDPolicy
	interval time.Duration
	notify   func()

	mu        sync.Mutex
	gpus      map[string]*gpuState // by PCI address
	byIndex   map[int]string       // NVML index -> PCI address, as last read
	nameless  map[int]bool         // indexes logged as unreportable
	lastCheck time.Time
	rearm     chan struct{} // a GPU came back: register it for events
	checkNow  chan struct{}
	// events counts the NVML events applied (Events).
	events atomic.Uint64
}

// gpuState is what is wrong with one GPU.
type gpuState struct {
	lost       bool
	unreadable string
	// fault is a GPU-wide XID, ECC or recovery-action fault.
	fault *hw.Fault
	// partitions are faults confined to MIG GPU instances.
	partitions map[hw.Placement]hw.Fault
	// recovery is the driver's last reported recovery action; nil where
	// it reports none.
	recovery *hw.GPURecoveryAction
}

func (s *gpuState) faulty() bool {
	return s.lost || s.unreadable != "" || s.fault != nil || len(s.partitions) > 0
}

// NewGPUMonitor returns a monitor that checks every interval and calls
// notify (which must not block) whenever the faults change.
func NewGPUMonitor(src GPUSource, policy XIDPolicy, interval time.Duration, notify func()) *GPUMonitor {
	return &GPUMonitor{
		src: src, policy: policy, interval: interval, notify: notify,
		gpus: map[string]*gpuState{}, byIndex: map[int]string{}, nameless: map[int]bool{},
		rearm: make(chan struct{}, 1), checkNow: make(chan struct{}, 1),
	}
}

// Run watches events and checks the GPUs until ctx ends. A failed event
// watch is restarted with backoff; the checks go on meanwhile.
func (m *GPUMonitor) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("gpu-health")
	events := make(chan hw.GPUEvent, 64)
	go m.watch(klog.NewContext(ctx, logger), events)
	m.check(ctx, logger)
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			m.event(logger, ev)
		case <-t.C:
			m.check(ctx, logger)
		case <-m.checkNow:
			m.check(ctx, logger)
		}
	}
}

// watch keeps an event watch running, restarting it after failures (with
// backoff) and when a GPU came back.
func (m *GPUMonitor) watch(ctx context.Context, out chan<- hw.GPUEvent) {
	logger := klog.FromContext(ctx)
	backoff := time.Second
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- m.src.WatchEvents(wctx, out) }()
		var err error
		select {
		case err = <-done:
		case <-m.rearm:
			cancel()
			err = <-done
			backoff = time.Second
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			logger.Error(err, "GPU health events: relying on periodic checks until the watch restarts", "retryIn", backoff)
		}
		if time.Since(start) > time.Minute {
			backoff = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-m.rearm:
			backoff = time.Second
		case <-time.After(backoff):
			backoff = min(2*backoff, time.Minute)
		}
	}
}

func (m *GPUMonitor) state(busID string) *gpuState {
	s := m.gpus[busID]
	if s == nil {
		s = &gpuState{}
		m.gpus[busID] = s
	}
	return s
}

// event applies one NVML event.
func (m *GPUMonitor) event(logger klog.Logger, ev hw.GPUEvent) {
	defer m.events.Add(1) // after the notification
	if ev.PCIBusID == "" {
		// The wait does not say which GPU: ask them all.
		select {
		case m.checkNow <- struct{}{}:
		default:
		}
		return
	}
	m.mu.Lock()
	before := m.snapshotLocked()
	s := m.state(ev.PCIBusID)
	if ev.RecoveryAction != nil {
		s.recovery = ev.RecoveryAction
	}
	switch ev.Kind {
	case hw.GPUEventXID, hw.GPUEventDoubleBitECC:
		if f, ok := m.judge(ev); ok {
			if ev.Partition != nil {
				if s.partitions == nil {
					s.partitions = map[hw.Placement]hw.Fault{}
				}
				s.partitions[*ev.Partition] = f
			} else {
				s.fault = &f
			}
			logger.Info("GPU fault", "gpu", ev.PCIBusID, "reason", f.Reason, "message", f.Message)
		} else {
			logger.V(2).Info("GPU event is no device failure", "gpu", ev.PCIBusID, "kind", ev.Kind, "xid", ev.XID)
		}
	case hw.GPUEventUnavailable:
		s.lost = true
	}
	m.recoveredLocked(ev.PCIBusID, s)
	changed := !equalHealth(before, m.snapshotLocked())
	m.mu.Unlock()
	if changed {
		m.notify()
	}
}

// judge decides whether an XID or ECC event is a device failure, and
// which.
func (m *GPUMonitor) judge(ev hw.GPUEvent) (hw.Fault, bool) {
	where := "GPU " + ev.PCIBusID
	if ev.Partition != nil {
		where += fmt.Sprintf(" (MIG GPU instance at memory slices %d-%d)", ev.Partition.Start, ev.Partition.Start+ev.Partition.Size-1)
	}
	var f hw.Fault
	switch ev.Kind {
	case hw.GPUEventXID:
		if m.policy.Ignored(ev.XID) {
			return f, false
		}
		f = hw.Fault{Reason: fmt.Sprintf("XID%d", ev.XID), Message: describeXID(ev.XID) + " on " + where, Fatal: fatalXID(ev.XID)}
	default:
		f = hw.Fault{Reason: "ECCDoubleBit", Message: "uncorrectable (double-bit) ECC error on " + where, Fatal: true}
	}
	if a := ev.RecoveryAction; a != nil {
		if *a == hw.RecoveryNone {
			return f, false // the driver asks for nothing: not the device's failure
		}
		f.Message += "; the driver asks for a " + a.String()
		f.Fatal = fatalAction(*a)
	}
	return f, true
}

// recoveredLocked clears the XID and ECC faults of a GPU whose driver
// asks for no recovery action any more.
func (m *GPUMonitor) recoveredLocked(busID string, s *gpuState) {
	if s.recovery != nil && *s.recovery == hw.RecoveryNone && !s.lost {
		s.fault, s.partitions = nil, nil
	}
	if !s.faulty() && s.recovery == nil {
		delete(m.gpus, busID)
	}
}

// check asks every GPU.
func (m *GPUMonitor) check(ctx context.Context, logger klog.Logger) {
	checks, err := m.src.CheckGPUs(ctx)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			logger.Error(err, "Checking GPUs")
		}
		return
	}
	m.mu.Lock()
	before := m.snapshotLocked()
	back := false
	for _, c := range checks {
		busID := c.PCIBusID
		if busID == "" {
			busID = m.byIndex[c.Index]
		} else {
			m.byIndex[c.Index] = busID
		}
		if busID == "" {
			if !m.nameless[c.Index] {
				m.nameless[c.Index] = true
				logger.Error(nil, "A GPU answers nothing, not even its PCI address, and was never read since the agent started: it cannot be published or reported", "index", c.Index, "lost", c.Lost, "err", c.Error)
			}
			continue
		}
		s := m.state(busID)
		if s.lost && !c.Lost {
			back = true
			if c.RecoveryAction == nil {
				// Back on the bus means reset: nothing else would tell.
				s.fault, s.partitions = nil, nil
			}
		}
		s.lost, s.unreadable = c.Lost, c.Error
		if c.RecoveryAction != nil {
			s.recovery = c.RecoveryAction
			if a := *c.RecoveryAction; a != hw.RecoveryNone && s.fault == nil && len(s.partitions) == 0 {
				// Asked for without an event we saw (the agent started
				// after it): the whole GPU is at fault.
				s.fault = &hw.Fault{Reason: "RecoveryAction", Message: "GPU " + busID + ": the driver asks for a " + a.String(), Fatal: fatalAction(a)}
			}
		}
		m.recoveredLocked(busID, s)
	}
	m.lastCheck = time.Now()
	changed := !equalHealth(before, m.snapshotLocked())
	m.mu.Unlock()
	if back {
		select {
		case m.rearm <- struct{}{}:
		default:
		}
	}
	if changed {
		m.notify()
	}
}

// Probed takes a probe's findings: GPUs read answered; unreadable ones did
// not (lost, or a query failed). A GPU the probe no longer lists at all is
// gone from the bus: its faults go with it.
func (m *GPUMonitor) Probed(inv hw.Inventory) {
	m.mu.Lock()
	before := m.snapshotLocked()
	present := map[string]bool{}
	for _, g := range inv.GPUs {
		m.byIndex[g.Index] = g.PCIBusID
		present[g.PCIBusID] = true
	}
	unreadable := map[string]hw.UnreadableGPU{}
	for _, u := range inv.UnreadableGPUs {
		busID := u.PCIBusID
		if busID == "" {
			busID = m.byIndex[u.Index]
		}
		if busID != "" {
			unreadable[busID] = u
			present[busID] = true
		}
	}
	for busID := range present {
		s := m.state(busID)
		u, bad := unreadable[busID]
		s.lost = bad && u.Lost
		s.unreadable = ""
		if bad && !u.Lost {
			s.unreadable = u.Error
		}
		m.recoveredLocked(busID, s)
	}
	for busID := range m.gpus {
		if !present[busID] {
			delete(m.gpus, busID)
		}
	}
	changed := !equalHealth(before, m.snapshotLocked())
	m.mu.Unlock()
	if changed {
		m.notify()
	}
}

// Events is how many NVML events the monitor has applied (XIDs, ECC
// errors, GPUs lost, recovery actions), device failures or not; a change
// an event made has been told (notify) by the time it is counted.
func (m *GPUMonitor) Events() uint64 { return m.events.Load() }

// Faults returns the GPUs' faults: hw.Health's GPUs and Partitions.
func (m *GPUMonitor) Faults() hw.Health {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.snapshotLocked()
}

// LastCheck is when the monitor last completed a check (zero: none yet).
func (m *GPUMonitor) LastCheck() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastCheck
}

func (m *GPUMonitor) snapshotLocked() hw.Health {
	var h hw.Health
	for busID, s := range m.gpus {
		if f, ok := s.gpuFault(busID); ok {
			if h.GPUs == nil {
				h.GPUs = map[string]hw.Fault{}
			}
			h.GPUs[busID] = f
		}
		for pl, f := range s.partitions {
			if h.Partitions == nil {
				h.Partitions = map[hw.PartitionRef]hw.Fault{}
			}
			h.Partitions[hw.PartitionRef{GPU: busID, Placement: pl}] = f
		}
	}
	return h
}

// gpuFault is the worst of a GPU's GPU-wide faults.
func (s *gpuState) gpuFault(busID string) (hw.Fault, bool) {
	switch {
	case s.lost:
		return hw.Fault{Reason: "GPULost", Message: "GPU " + busID + " has fallen off the bus (NVML: GPU is lost)", Fatal: true}, true
	case s.fault != nil:
		return *s.fault, true
	case s.unreadable != "":
		return hw.Fault{Reason: "Unreadable", Message: "GPU " + busID + " cannot be read: " + s.unreadable}, true
	}
	return hw.Fault{}, false
}

func equalHealth(a, b hw.Health) bool {
	return maps.Equal(a.GPUs, b.GPUs) && maps.Equal(a.Partitions, b.Partitions) &&
		maps.Equal(a.PFs, b.PFs) && maps.Equal(a.VFs, b.VFs)
}
