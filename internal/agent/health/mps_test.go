// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/hw"
)

type fakeDaemons struct {
	specs map[string]mps.Spec
	down  map[string]error // found down by the next Supervise (then up again)
}

func (f *fakeDaemons) Supervise(context.Context) map[string]error {
	d := f.down
	f.down = nil
	return d
}

func (f *fakeDaemons) Spec(id string) (mps.Spec, bool) {
	s, ok := f.specs[id]
	return s, ok
}

// A daemon found down faults what it serves until a check finds it back;
// each change is told.
func TestMPSMonitor(t *testing.T) {
	mig := hw.PartitionRef{GPU: "0000:1b:00.0", Placement: hw.Placement{Start: 4, Size: 2}}
	gpu := hw.PartitionRef{GPU: "0000:43:00.0"}
	d := &fakeDaemons{specs: map[string]mps.Spec{
		"claim": {ID: "claim", Owner: "uid-1", Serves: []hw.PartitionRef{mig}},
		"share": {ID: "share", Owner: mps.OwnerShares, Serves: []hw.PartitionRef{gpu}},
	}}
	changes := 0
	m := NewMPSMonitor(d, time.Hour, func() { changes++ })
	ctx := context.Background()
	m.Check(ctx)
	if len(m.Faults()) != 0 || changes != 0 || !m.Alive(time.Minute) {
		t.Fatalf("all up: faults %v, changes %d", m.Faults(), changes)
	}
	d.down = map[string]error{"claim": errors.New("process 7 is gone"), "share": errors.New("no answer")}
	m.Check(ctx)
	f := m.Faults()
	if len(f) != 2 || changes != 1 {
		t.Fatalf("down: faults %v, changes %d", f, changes)
	}
	if got := f[hw.MPSRef{PartitionRef: mig}]; got.Reason != "MPSDaemonDown" || got.Fatal {
		t.Errorf("the claim's MIG partition: %+v", got)
	}
	if _, ok := f[hw.MPSRef{PartitionRef: gpu, Shares: true}]; !ok {
		t.Errorf("the GPU's shares are not faulted: %v", f)
	}
	m.Check(ctx)
	if len(m.Faults()) != 0 || changes != 2 {
		t.Errorf("back up: faults %v, changes %d", m.Faults(), changes)
	}
}

// A dedicated share's daemon (its owner a claim, as a claim's MPS
// daemon's is) serves the GPU's share device, not the whole GPU: its
// fault is the shares' (prepare/gpu's TestDedicatedShareDaemonDown runs
// it through the devices).
func TestMPSMonitorDedicatedShare(t *testing.T) {
	gpu := hw.PartitionRef{GPU: "0000:1b:00.0"}
	d := &fakeDaemons{specs: map[string]mps.Spec{
		"dedicated": {ID: "dedicated", Owner: "uid-1", Share: true, Serves: []hw.PartitionRef{gpu}},
	}}
	m := NewMPSMonitor(d, time.Hour, func() {})
	d.down = map[string]error{"dedicated": errors.New("process 7 is gone")}
	m.Check(context.Background())
	f := m.Faults()
	if _, ok := f[hw.MPSRef{PartitionRef: gpu, Shares: true}]; !ok || len(f) != 1 {
		t.Errorf("faults %v, want the GPU's shares alone", f)
	}
}
