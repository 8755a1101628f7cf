// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock"
	"github.com/hwdra/hwdra/internal/mock/fault"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// watch starts WatchEvents on a mock and returns its events.
func watch(t *testing.T, h *mock.Hardware) (*Backend, <-chan hw.GPUEvent) {
	t.Helper()
	b := New(h.NVML, WithSysfs(h.Sysfs))
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan hw.GPUEvent, 16)
	done := make(chan error, 1)
	go func() { done <- b.WatchEvents(ctx, events) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchEvents: %v", err)
		}
		b.Shutdown()
	})
	return b, events
}

func next(t *testing.T, events <-chan hw.GPUEvent) hw.GPUEvent {
	t.Helper()
	select {
	case ev := <-events:
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	return hw.GPUEvent{}
}

func inject(t *testing.T, h *mock.Hardware, f fault.Fault) {
	t.Helper()
	// Arming is asynchronous: retry until the event arrives is the
	// caller's business; a short pause lets the set be registered.
	if err := h.Inject(f); err != nil {
		t.Fatal(err)
	}
}

// TestWatchEvents: an XID arrives with its GPU, the recovery action the
// driver asks for and, when confined to a MIG GPU instance, that
// instance's placement; a lost GPU and its recovery come through too.
func TestWatchEvents(t *testing.T) {
	h := mocktest.Open(t, `gpus: [{model: h100-80gb, count: 2, mig: true, migInstances: [{profile: 3g.40gb, start: 4}]}]`)
	b, events := watch(t, h)
	// The watch arms asynchronously: wait until an XID makes it through.
	var ev hw.GPUEvent
	waitfor.True(t, "an XID through the armed watch", 5*time.Second, func() bool {
		inject(t, h, fault.Fault{Kind: fault.XID, GPU: "0000:43:00.0", XID: 13})
		select {
		case ev = <-events:
			return true
		case <-time.After(100 * time.Millisecond):
			return false
		}
	})
	if ev.Kind != hw.GPUEventXID || ev.XID != 13 || ev.PCIBusID != "0000:43:00.0" || ev.Partition != nil ||
		ev.RecoveryAction == nil || *ev.RecoveryAction != hw.RecoveryNone {
		t.Fatalf("XID 13: %+v", ev)
	}
	for len(events) > 0 {
		<-events
	}

	gis, err := b.GPUInstances("0000:1b:00.0")
	if err != nil || len(gis) != 1 {
		t.Fatalf("GPU instances %v %v", gis, err)
	}
	inject(t, h, fault.Fault{Kind: fault.XID, GPU: "0000:1b:00.0", XID: 94, GPUInstance: &gis[0].ID})
	ev = next(t, events)
	if ev.XID != 94 || ev.Partition == nil || *ev.Partition != gis[0].Placement ||
		ev.RecoveryAction == nil || *ev.RecoveryAction != hw.RecoveryGPUReset {
		t.Fatalf("XID 94 in GPU instance %d: %+v (partition %v)", gis[0].ID, ev, ev.Partition)
	}

	inject(t, h, fault.Fault{Kind: fault.GPULost, GPU: "0000:1b:00.0"})
	if ev = next(t, events); ev.XID != 79 || ev.PCIBusID != "0000:1b:00.0" {
		t.Fatalf("first event of a lost GPU: %+v", ev)
	}
	if ev = next(t, events); ev.Kind != hw.GPUEventUnavailable || ev.PCIBusID != "" {
		t.Fatalf("second event of a lost GPU: %+v", ev)
	}
	checks, err := b.CheckGPUs(context.Background())
	if err != nil || len(checks) != 2 {
		t.Fatalf("checks %+v %v", checks, err)
	}
	if c := checks[0]; !c.Lost || c.PCIBusID != "" {
		t.Errorf("check of the lost GPU: %+v", c)
	}
	if c := checks[1]; c.Lost || c.PCIBusID != "0000:43:00.0" || c.RecoveryAction == nil {
		t.Errorf("check of the other GPU: %+v", c)
	}

	inject(t, h, fault.Fault{Kind: fault.Clear, GPU: "0000:1b:00.0"})
	if ev = next(t, events); ev.Kind != hw.GPUEventRecoveryAction || ev.PCIBusID != "0000:1b:00.0" || *ev.RecoveryAction != hw.RecoveryNone {
		t.Fatalf("event after clear: %+v", ev)
	}
}

// TestWatchEventsWithoutSupport: with no GPU able to deliver events the
// watch says so at once.
func TestWatchEventsWithoutSupport(t *testing.T) {
	h := mocktest.Open(t, `gpus: [{model: h100-80gb, count: 1}]`)
	h.Inject(fault.Fault{Kind: fault.GPULost, GPU: "0000:1b:00.0"})
	b := New(h.NVML, WithSysfs(h.Sysfs))
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	err := b.WatchEvents(context.Background(), make(chan hw.GPUEvent))
	if !errors.Is(err, ErrNoEvents) || !errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		t.Fatalf("WatchEvents with the only GPU lost: %v", err)
	}
}

// TestNoRecoveryField: where the driver has no recovery action field,
// events and checks carry none.
func TestNoRecoveryField(t *testing.T) {
	h := mocktest.Open(t, `gpus: [{model: a100-40gb, count: 1, noRecoveryAction: true}]`)
	b := New(h.NVML, WithSysfs(h.Sysfs))
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	checks, err := b.CheckGPUs(context.Background())
	if err != nil || len(checks) != 1 || checks[0].RecoveryAction != nil || checks[0].Error != "" {
		t.Fatalf("checks %+v %v", checks, err)
	}
}
