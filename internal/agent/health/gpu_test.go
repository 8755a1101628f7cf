// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"
)

// fakeGPUs answers checks from a table; WatchEvents is not used by these
// tests (they hand events to the monitor directly).
type fakeGPUs struct{ checks []hw.GPUCheck }

func (f *fakeGPUs) WatchEvents(ctx context.Context, _ chan<- hw.GPUEvent) error {
	<-ctx.Done()
	return nil
}
func (f *fakeGPUs) CheckGPUs(context.Context) ([]hw.GPUCheck, error) { return f.checks, nil }

func action(a hw.GPURecoveryAction) *hw.GPURecoveryAction { return &a }

const (
	gpuA = "0000:1b:00.0"
	gpuB = "0000:43:00.0"
)

// step is one input to the monitor: an event, a check or a probe.
type step struct {
	event  *hw.GPUEvent
	checks []hw.GPUCheck
	probe  *hw.Inventory
}

func xidEvent(bus string, xid uint64, ra *hw.GPURecoveryAction) step {
	return step{event: &hw.GPUEvent{PCIBusID: bus, Kind: hw.GPUEventXID, XID: xid, RecoveryAction: ra}}
}

// want is a GPU's or partition's fault, by reason ("" for none).
type want map[string]string

func TestGPUMonitor(t *testing.T) {
	part := hw.Placement{Start: 4, Size: 4}
	partKey := gpuA + "@4+4"
	// The agent probes before anything else: the monitor knows the GPUs'
	// indexes, which is all a lost GPU still tells.
	probed := step{probe: &hw.Inventory{GPUs: []hw.GPU{{PCIBusID: gpuA, Index: 0}, {PCIBusID: gpuB, Index: 1}}}}
	healthy := []hw.GPUCheck{{Index: 0, PCIBusID: gpuA, RecoveryAction: action(hw.RecoveryNone)}, {Index: 1, PCIBusID: gpuB, RecoveryAction: action(hw.RecoveryNone)}}
	for _, tc := range []struct {
		name   string
		policy config.HealthPolicy
		steps  []step
		want   want
		fatal  bool   // the first fault's Fatal
		msg    string // part of the first fault's message
	}{{
		name:  "XID 79 with a reset asked for: the GPU, fatal",
		steps: []step{xidEvent(gpuA, 79, action(hw.RecoveryGPUReset))},
		want:  want{gpuA: "XID79"}, fatal: true, msg: "XID 79 (GPU has fallen off the bus) on GPU 0000:1b:00.0; the driver asks for a GPU reset",
	}, {
		name:  "and the driver asking for nothing any more: recovered",
		steps: []step{xidEvent(gpuA, 79, action(hw.RecoveryGPUReset)), {checks: healthy}},
		want:  want{},
	}, {
		name:  "recovery-action event: recovered",
		steps: []step{xidEvent(gpuA, 79, action(hw.RecoveryGPUReset)), {event: &hw.GPUEvent{PCIBusID: gpuA, Kind: hw.GPUEventRecoveryAction, RecoveryAction: action(hw.RecoveryNone)}}},
		want:  want{},
	}, {
		name:  "application XID 13: nothing",
		steps: []step{xidEvent(gpuA, 13, action(hw.RecoveryNone)), xidEvent(gpuB, 13, nil)},
		want:  want{},
	}, {
		name:  "a failure XID the driver asks nothing for: nothing",
		steps: []step{xidEvent(gpuA, 48, action(hw.RecoveryNone))},
		want:  want{},
	}, {
		name:  "XID confined to a GPU instance: that partition only",
		steps: []step{{event: &hw.GPUEvent{PCIBusID: gpuA, Kind: hw.GPUEventXID, XID: 94, Partition: &part, RecoveryAction: action(hw.RecoveryGPUReset)}}},
		want:  want{partKey: "XID94"}, fatal: true, msg: "MIG GPU instance at memory slices 4-7",
	}, {
		name:  "without the recovery field: the XID decides, and stays",
		steps: []step{xidEvent(gpuA, 48, nil), {checks: []hw.GPUCheck{{Index: 0, PCIBusID: gpuA}}}},
		want:  want{gpuA: "XID48"}, fatal: true, msg: "double-bit ECC error",
	}, {
		name:  "without the field an unknown XID is a non-fatal fault",
		steps: []step{xidEvent(gpuA, 1234, nil)},
		want:  want{gpuA: "XID1234"}, msg: "XID 1234 on GPU",
	}, {
		name:   "configuration: 13 reported, 48 ignored",
		policy: config.HealthPolicy{ReportXIDs: []uint64{13}, IgnoreXIDs: []uint64{48}},
		steps:  []step{xidEvent(gpuA, 13, nil), xidEvent(gpuB, 48, nil)},
		want:   want{gpuA: "XID13"},
	}, {
		name:  "double-bit ECC",
		steps: []step{{event: &hw.GPUEvent{PCIBusID: gpuB, Kind: hw.GPUEventDoubleBitECC}}},
		want:  want{gpuB: "ECCDoubleBit"}, fatal: true,
	}, {
		name:  "lost in a check, the other GPU untouched",
		steps: []step{probed, {checks: []hw.GPUCheck{{Index: 0, Lost: true}, {Index: 1, PCIBusID: gpuB}}}},
		want:  want{gpuA: "GPULost"}, fatal: true, msg: "fallen off the bus",
	}, {
		name: "lost, then back on the bus: without the field its XIDs go too (a reset)",
		steps: []step{probed, xidEvent(gpuA, 79, nil), {checks: []hw.GPUCheck{{Index: 0, Lost: true}}},
			{checks: []hw.GPUCheck{{Index: 0, PCIBusID: gpuA}}}},
		want: want{},
	}, {
		name:  "an event set answering lost, then the check finds which",
		steps: []step{probed, {event: &hw.GPUEvent{Kind: hw.GPUEventUnavailable}}, {checks: []hw.GPUCheck{{Index: 0, Lost: true}, {Index: 1, PCIBusID: gpuB}}}},
		want:  want{gpuA: "GPULost"}, fatal: true,
	}, {
		name:  "a recovery action asked for with no event seen: the whole GPU",
		steps: []step{{checks: []hw.GPUCheck{{Index: 0, PCIBusID: gpuA, RecoveryAction: action(hw.RecoveryNodeReboot)}}}},
		want:  want{gpuA: "RecoveryAction"}, fatal: true, msg: "the driver asks for a node reboot",
	}, {
		name:  "drain P2P: unhealthy, not fatal",
		steps: []step{xidEvent(gpuA, 74, action(hw.RecoveryDrainP2P))},
		want:  want{gpuA: "XID74"}, msg: "drain peer-to-peer traffic",
	}, {
		name:  "probe: a GPU that failed a query",
		steps: []step{{probe: &hw.Inventory{GPUs: []hw.GPU{{PCIBusID: gpuB, Index: 1}}, UnreadableGPUs: []hw.UnreadableGPU{{Index: 0, PCIBusID: gpuA, Error: "GPU 0: GetMemoryInfo: ERROR_UNKNOWN"}}}}},
		want:  want{gpuA: "Unreadable"}, msg: "GetMemoryInfo: ERROR_UNKNOWN",
	}, {
		name: "probe: lost by index, then read again",
		steps: []step{{probe: &hw.Inventory{GPUs: []hw.GPU{{PCIBusID: gpuA, Index: 0}}}},
			{probe: &hw.Inventory{UnreadableGPUs: []hw.UnreadableGPU{{Index: 0, Lost: true}}}},
			{probe: &hw.Inventory{GPUs: []hw.GPU{{PCIBusID: gpuA, Index: 0}}}}},
		want: want{},
	}, {
		name:  "probe: gone from the bus altogether, its faults go",
		steps: []step{xidEvent(gpuA, 48, nil), {probe: &hw.Inventory{GPUs: []hw.GPU{{PCIBusID: gpuB, Index: 1}}}}},
		want:  want{},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			notified := 0
			m := NewGPUMonitor(&fakeGPUs{}, NewXIDPolicy(tc.policy), 0, func() { notified++ })
			logger, _ := ktesting.NewTestContext(t)
			events := uint64(0)
			for _, s := range tc.steps {
				switch {
				case s.event != nil:
					m.event(logger, *s.event)
					if events++; m.Events() != events {
						t.Errorf("%d events counted, %d applied", m.Events(), events)
					}
				case s.checks != nil:
					m.src.(*fakeGPUs).checks = s.checks
					m.check(context.Background(), logger)
				case s.probe != nil:
					m.Probed(*s.probe)
				}
			}
			h := m.Faults()
			got := want{}
			var first hw.Fault
			for bus, f := range h.GPUs {
				got[bus] = f.Reason
				first = f
			}
			for ref, f := range h.Partitions {
				got[ref.GPU+"@"+strconv.Itoa(ref.Placement.Start)+"+"+strconv.Itoa(ref.Placement.Size)] = f.Reason
				first = f
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("faults %v, want %v (%+v)", got, tc.want, h)
			}
			if len(tc.want) > 0 {
				if first.Fatal != tc.fatal || !strings.Contains(first.Message, tc.msg) {
					t.Errorf("fault %+v, want fatal %v and a message with %q", first, tc.fatal, tc.msg)
				}
				if notified == 0 {
					t.Error("a change without notice")
				}
			}
		})
	}
}

func TestXIDPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy  config.HealthPolicy
		ignored []uint64
		counted []uint64
	}{
		{config.HealthPolicy{}, []uint64{13, 31, 43, 45, 68, 109}, []uint64{48, 79, 94, 1}},
		{config.HealthPolicy{IgnoreXIDs: []uint64{63}, ReportXIDs: []uint64{43}}, []uint64{13, 63}, []uint64{43, 79}},
	} {
		p := NewXIDPolicy(tc.policy)
		for _, x := range tc.ignored {
			if !p.Ignored(x) {
				t.Errorf("%+v: XID %d counted", tc.policy, x)
			}
		}
		for _, x := range tc.counted {
			if p.Ignored(x) {
				t.Errorf("%+v: XID %d ignored", tc.policy, x)
			}
		}
	}
}
