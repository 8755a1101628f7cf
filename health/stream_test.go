package health

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/hwdra/hwdra/hw"
)

// gpuOf is a device that takes GPU bus's fault.
type gpuOf string

func (g gpuOf) Fault(h hw.Health) (hw.Fault, bool) { return h.GPUFault(string(g), nil) }

// fakeNode is what a stream reads, changeable under a lock.
type fakeNode struct {
	mu      sync.Mutex
	devices []Device
	health  hw.Health
	alive   bool
	changed *Broadcast
}

func (n *fakeNode) stream(timeout time.Duration) Stream {
	return Stream{Source: n, Timeout: timeout}
}

func (n *fakeNode) Devices() []Device        { n.mu.Lock(); defer n.mu.Unlock(); return n.devices }
func (n *fakeNode) Faults() hw.Health        { n.mu.Lock(); defer n.mu.Unlock(); return n.health }
func (n *fakeNode) Alive(time.Duration) bool { n.mu.Lock(); defer n.mu.Unlock(); return n.alive }
func (n *fakeNode) Changed() <-chan struct{} { return n.changed.Changed() }

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
	return &fakeNode{alive: true, changed: NewBroadcast(), devices: []Device{
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
	n.set(func(n *fakeNode) {})
	if r, ok := receive(t, reports, 100*time.Millisecond); ok {
		t.Fatalf("report without a change: %+v", r)
	}
	n.set(func(n *fakeNode) {
		n.devices = append(n.devices, Device{Pool: "node", Name: "gpu-c", Of: gpuOf("0000:52:00.0")})
	})
	if r, ok := receive(t, reports, time.Second); !ok || len(r) != 1 || r["gpu-c"].Health != kubeletplugin.HealthStatusHealthy {
		t.Fatalf("report of a new device %+v", r)
	}
	n.set(func(n *fakeNode) { n.health = hw.Health{} })
	if r, ok := receive(t, reports, time.Second); !ok || len(r) != 1 || r["gpu-a"].Health != kubeletplugin.HealthStatusHealthy || r["gpu-a"].Message != "" {
		t.Fatalf("report after recovery %+v", r)
	}
}

// TestStreamResends: every device again within its timeout while the
// monitor lives, none while it is stalled (the kubelet then reports them
// Unknown), and again once it lives.
func TestStreamResends(t *testing.T) {
	n := twoGPUs()
	const timeout = 900 * time.Millisecond // re-sent every 300ms
	reports, stop := watch(t, n, timeout)
	defer stop()
	for i := 0; i < 3; i++ {
		if r, ok := receive(t, reports, timeout/3+300*time.Millisecond); !ok || len(r) != 2 {
			t.Fatalf("report %d: %+v %v", i, r, ok)
		}
	}
	n.mu.Lock()
	n.alive = false
	n.mu.Unlock()
	time.Sleep(timeout / 3)
	receive(t, reports, 50*time.Millisecond) // a re-send in flight
	if r, ok := receive(t, reports, timeout); ok {
		t.Fatalf("re-sent while the monitor is stalled: %+v", r)
	}
	n.mu.Lock()
	n.alive = true
	n.mu.Unlock()
	if r, ok := receive(t, reports, timeout/3+300*time.Millisecond); !ok || len(r) != 2 {
		t.Fatalf("after the monitor came back: %+v %v", r, ok)
	}
}
