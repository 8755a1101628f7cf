// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/hwdra/hwdra/internal/hw"
)

// gpuOf is a device that takes GPU bus's fault.
type gpuOf string

func (g gpuOf) Fault(h hw.Health) (hw.Fault, bool) { return h.GPUFault(string(g), nil) }

// fakeNode is what a stream reads, changeable under a lock. It tells
// when the stream read the devices (reads). Its monitor checks whenever
// asked while alive; stopped, its last check stays where it was.
type fakeNode struct {
	mu        sync.Mutex
	devices   []Device
	health    hw.Health
	alive     bool
	lastCheck time.Time
	changed   *Broadcast
	reads     chan struct{}
}

func (n *fakeNode) stream(timeout time.Duration) Stream {
	return Stream{Source: n, Timeout: timeout, Monitor: "the test's monitor"}
}

func (n *fakeNode) Devices() []Device {
	n.mu.Lock()
	defer n.mu.Unlock()
	tell(n.reads)
	return n.devices
}

func (n *fakeNode) Faults() hw.Health { n.mu.Lock(); defer n.mu.Unlock(); return n.health }

func (n *fakeNode) LastCheck() time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.alive {
		n.lastCheck = time.Now()
	}
	return n.lastCheck
}

func (n *fakeNode) Changed() <-chan struct{} { return n.changed.Changed() }

// tell signals on ch without waiting (a test reads only what it needs).
func tell(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// drain forgets a signal already given.
func drain(ch chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

// wait waits for a signal of the stream (a guard of 10s against hanging).
func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("the stream never %s", what)
	}
}

func (n *fakeNode) set(f func(*fakeNode)) {
	n.mu.Lock()
	f(n)
	n.mu.Unlock()
	n.changed.Notify()
}

func receive(t *testing.T, reports <-chan kubeletplugin.DeviceHealthReport, within time.Duration) (map[string]kubeletplugin.DeviceHealth, bool) {
	t.Helper()
	select {
	case r := <-reports:
		out := map[string]kubeletplugin.DeviceHealth{}
		for _, d := range r.Devices {
			if d.PoolName != "node" || d.HealthCheckTimeout <= 0 || d.LastUpdated.IsZero() {
				t.Errorf("report entry %+v", d)
			}
			out[d.DeviceName] = d
		}
		return out, true
	case <-time.After(within):
		return nil, false
	}
}

func watch(t *testing.T, n *fakeNode, timeout time.Duration) (<-chan kubeletplugin.DeviceHealthReport, func()) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	reports := make(chan kubeletplugin.DeviceHealthReport)
	done := make(chan error, 1)
	go func() { done <- n.stream(timeout).Watch(ctx, reports) }()
	return reports, func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Watch: %v", err)
			}
		case <-time.After(time.Second):
			t.Fatal("Watch did not end with its context")
		}
	}
}

func twoGPUs() *fakeNode {
	return &fakeNode{alive: true, changed: NewBroadcast(), reads: make(chan struct{}, 1), devices: []Device{
		{Pool: "node", Name: "gpu-a", Of: gpuOf(gpuA)}, {Pool: "node", Name: "gpu-b", Of: gpuOf(gpuB)},
	}}
}

// TestStreamChanges: a full report first, then exactly the devices whose
// health changed (with the fault's message), new devices included; a
// change that changes nothing sends nothing; the stream ends cleanly with
// its context.
func TestStreamChanges(t *testing.T) {
	n := twoGPUs()
	const timeout = time.Hour // no re-send during the test
	reports, stop := watch(t, n, timeout)
	defer stop()
	first, ok := receive(t, reports, time.Second)
	if !ok || len(first) != 2 || first["gpu-a"].Health != kubeletplugin.HealthStatusHealthy || first["gpu-a"].HealthCheckTimeout != timeout {
		t.Fatalf("first report %+v", first)
	}
	n.set(func(n *fakeNode) {
		n.health = hw.Health{GPUs: map[string]hw.Fault{gpuA: {Reason: "XID79", Message: "XID 79 (GPU has fallen off the bus)"}}}
	})
	r, ok := receive(t, reports, time.Second)
	if !ok || len(r) != 1 || r["gpu-a"].Health != kubeletplugin.HealthStatusUnhealthy || r["gpu-a"].Message != "XID 79 (GPU has fallen off the bus)" {
		t.Fatalf("report after the fault: %+v", r)
	}
	// A change that changes nothing: once the stream has read the node
	// again, a report it would send is next, before the new device's.
	drain(n.reads)
	n.set(func(n *fakeNode) {})
	wait(t, n.reads, "read the node after a change")
	n.set(func(n *fakeNode) {
		n.devices = append(n.devices, Device{Pool: "node", Name: "gpu-c", Of: gpuOf("0000:52:00.0")})
	})
	if r, ok := receive(t, reports, time.Second); !ok || len(r) != 1 || r["gpu-c"].Health != kubeletplugin.HealthStatusHealthy {
		t.Fatalf("report of a new device (none before it: the change that changed nothing) %+v", r)
	}
	n.set(func(n *fakeNode) { n.health = hw.Health{} })
	if r, ok := receive(t, reports, time.Second); !ok || len(r) != 1 || r["gpu-a"].Health != kubeletplugin.HealthStatusHealthy || r["gpu-a"].Message != "" {
		t.Fatalf("report after recovery %+v", r)
	}
}

// TestStreamResends: every device again within its timeout while the
// monitor checks; once it has stopped checking for 2/3 of the timeout
// (stalled), its devices are sent Unknown with a message saying why, not
// left to silence, and re-sent so; once it checks again they are sent
// as it finds them.
func TestStreamResends(t *testing.T) {
	n := twoGPUs()
	const timeout = 900 * time.Millisecond // re-sent every 300ms, stalled after 600ms
	reports, stop := watch(t, n, timeout)
	defer stop()
	for i := 0; i < 3; i++ {
		if r, ok := receive(t, reports, timeout/3+300*time.Millisecond); !ok || len(r) != 2 || r["gpu-a"].Health != kubeletplugin.HealthStatusHealthy {
			t.Fatalf("report %d: %+v %v", i, r, ok)
		}
	}
	n.mu.Lock()
	n.alive = false
	n.mu.Unlock()
	stalled := time.Now()
	unknown := 0
	for unknown < 2 { // the change, then a re-send of it
		r, ok := receive(t, reports, 2*time.Second)
		if !ok {
			t.Fatalf("no report %v after the monitor stopped checking: silence", time.Since(stalled))
		}
		if r["gpu-a"].Health != kubeletplugin.HealthStatusUnknown {
			continue // a re-send before the monitor counts as stalled
		}
		if unknown == 0 {
			t.Logf("Unknown sent %v after the monitor's last check (stalled after 600ms)", time.Since(stalled))
		}
		if m := r["gpu-a"].Message; !strings.Contains(m, "the test's monitor has completed no check for over 600ms") {
			t.Errorf("message of a stalled monitor's device: %q", m)
		}
		unknown++
	}
	n.mu.Lock()
	n.alive = true
	n.mu.Unlock()
	back := time.Now()
	for {
		r, ok := receive(t, reports, 3*time.Second)
		if !ok {
			t.Fatal("nothing sent after the monitor checked again")
		}
		if r["gpu-a"].Health == kubeletplugin.HealthStatusHealthy && r["gpu-a"].Message == "" && r["gpu-b"].Health == kubeletplugin.HealthStatusHealthy {
			t.Logf("Healthy again %v after the monitor's return", time.Since(back))
			return
		}
	}
}

// TestStreamUnmonitored: a device no monitor watches is Unknown with its
// reason, from the first report on, whatever the faults say and while
// the monitor of the others checks; a monitor that never checked leaves
// the others Unknown too.
func TestStreamUnmonitored(t *testing.T) {
	n := twoGPUs()
	n.devices = append(n.devices, Device{Pool: "node", Name: "gpu-vfio", Of: gpuOf("0000:52:00.0"), Unmonitored: "bound to vfio-pci"})
	reports, stop := watch(t, n, time.Hour)
	first, ok := receive(t, reports, time.Second)
	if !ok || first["gpu-vfio"].Health != kubeletplugin.HealthStatusUnknown || first["gpu-vfio"].Message != "bound to vfio-pci" || first["gpu-a"].Health != kubeletplugin.HealthStatusHealthy {
		t.Fatalf("first report %+v", first)
	}
	n.set(func(n *fakeNode) {
		n.health = hw.Health{GPUs: map[string]hw.Fault{"0000:52:00.0": {Reason: "XID79", Message: "XID 79"}}}
	})
	select {
	case r := <-reports:
		t.Fatalf("a fault of an unmonitored device changed its report: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
	stop()
	for _, st := range n.stream(time.Hour).States() {
		if want := map[bool]kubeletplugin.HealthStatus{true: kubeletplugin.HealthStatusUnknown, false: kubeletplugin.HealthStatusHealthy}[st.Name == "gpu-vfio"]; st.Health != want {
			t.Errorf("States: %s %s, want %s", st.Name, st.Health, want)
		}
	}

	never := twoGPUs()
	never.alive = false
	reports, stop = watch(t, never, time.Hour)
	defer stop()
	if r, ok := receive(t, reports, time.Second); !ok || r["gpu-a"].Health != kubeletplugin.HealthStatusUnknown || !strings.Contains(r["gpu-a"].Message, "has not completed its first check") {
		t.Fatalf("first report before any check: %+v", r)
	}
}
