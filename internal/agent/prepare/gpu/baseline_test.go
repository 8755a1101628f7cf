// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/hwdra/hwdra/internal/hw"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
)

// unclaimedSlices builds the slices from the node as the publisher sees it.
func (e *env) unclaimedSlices() any {
	e.t.Helper()
	inv, err := e.driver.Unclaimed(func() (hw.Inventory, error) {
		gpus, err := e.nvml.GPUs(context.Background())
		return hw.Inventory{GPUs: gpus}, err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return resources.GPU(testNode, inv.GPUs, device.AllFeatures)
}

// TestPreparedClaimsLeaveTheSlicesAsTheyWere: whatever prepare makes for a
// claim (a MIG mode switched, GPU and compute instances, mediated devices)
// is not in the view the slices are built from, so they are the same
// before, during and after the claim. State an administrator made stays in.
func TestPreparedClaimsLeaveTheSlicesAsTheyWere(t *testing.T) {
	for _, tc := range []struct {
		name, profile string
		req           request
		// changesHardware: the claim makes something (else the test
		// would prove nothing about hiding it).
		changesHardware bool
	}{
		{"full GPU", "gpus: [{model: h100-80gb, count: 2}]", request{name: "gpu", cel: `profile == "full"`}, false},
		{"MIG mode switched for the claim", "gpus: [{model: h100-80gb, count: 2}]", request{name: "mig", cel: `profile == "1g.10gb"`}, true},
		{"MIG partition", "gpus: [{model: h100-80gb, count: 2, mig: true}]", request{name: "mig", cel: `profile == "2g.20gb"`}, true},
		{"beside a static partition", "gpus: [{model: a100-40gb, count: 1, mig: true, migInstances: [{profile: 3g.20gb, start: 4}]}]",
			request{name: "mig", cel: `profile == "1g.5gb"`}, true},
		{"the static partition as it is", "gpus: [{model: a100-40gb, count: 1, mig: true, migInstances: [{profile: 3g.20gb, start: 4}]}]",
			request{name: "mig", cel: `profile == "3g.20gb"`}, false},
		{"MIG-backed vGPU", "h100-vgpu", request{name: "vgpu", cel: `type == "vgpu" && device.attributes["gpu.hwdra.io"].migBacked`}, true},
		{"time-sliced vGPU", "h100-vgpu", request{name: "vgpu", cel: `type == "vgpu" && !device.attributes["gpu.hwdra.io"].migBacked`}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.profile, true)
			before := e.unclaimedSlices()
			hwBefore := e.hwState()
			c := e.claim(tc.req)
			e.mustPrepare(c)
			if changed := e.hwState() != hwBefore; changed != tc.changesHardware {
				t.Fatalf("prepare changed the hardware: %v, want %v", changed, tc.changesHardware)
			}
			if during := e.unclaimedSlices(); !equality.Semantic.DeepEqual(before, during) {
				t.Errorf("the slices differ while the claim is prepared")
			}
			// A restarted agent knows its own state from the ledger.
			e.restart(nil)
			if during := e.unclaimedSlices(); !equality.Semantic.DeepEqual(before, during) {
				t.Errorf("the slices differ after a restart while the claim is prepared")
			}
			e.unprepare(c)
			if after := e.unclaimedSlices(); !equality.Semantic.DeepEqual(before, after) {
				t.Errorf("the slices differ after unprepare")
			}
		})
	}
}

// TestUnclaimedShowsWhatOthersMade: a GPU instance an administrator makes
// is in the view, also on a GPU whose MIG mode the agent switched.
func TestUnclaimedShowsWhatOthersMade(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	gpu := e.gpus[0].PCIBusID
	c := e.claim(request{name: "mig", cel: `profile == "1g.10gb"`})
	e.mustPrepare(c)
	p := migProfileNamed(t, e.gpus[0], "3g.40gb")
	at := hw.Placement{Start: 0, Size: 4}
	if _, err := e.nvml.CreateGPUInstance(gpu, p.ID, at); err != nil {
		t.Fatal(err)
	}
	inv, err := e.driver.Unclaimed(func() (hw.Inventory, error) {
		gpus, err := e.nvml.GPUs(context.Background())
		return hw.Inventory{GPUs: gpus}, err
	})
	if err != nil {
		t.Fatal(err)
	}
	g := inv.GPUs[0]
	if len(g.MIG.Instances) != 1 || g.MIG.Instances[0].Placement != at || !g.MIG.Enabled {
		t.Fatalf("view of the GPU: MIG %v, instances %+v; want MIG on with only the administrator's instance", g.MIG.Enabled, g.MIG.Instances)
	}
}

// TestUnclaimedProbesAgainWhenTheLedgerMoves: an instance made and destroyed
// by a prepare while the node was probed is not taken for someone else's.
func TestUnclaimedProbesAgainWhenTheLedgerMoves(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1, mig: true}]", true)
	gpu := e.gpus[0]
	p := migProfileNamed(t, gpu, "1g.10gb")
	at := p.Placements[0]
	key := giKey(gpu.PCIBusID, p.ID, at)
	probes := 0
	inv, err := e.driver.Unclaimed(func() (hw.Inventory, error) {
		probes++
		g := gpu
		if probes == 1 {
			// A prepare records and creates the instance, the probe sees
			// it, and an unprepare destroys it and forgets it.
			e.driver.ledger.Put(key, ledgerEntry{GPU: gpu.PCIBusID, Profile: p.ID, Placement: &at})
			g.MIG.Instances = []hw.GPUInstance{{ID: 1, ProfileID: p.ID, Placement: at}}
			e.driver.ledger.Delete(key)
		}
		return hw.Inventory{GPUs: []hw.GPU{g}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if probes != 2 || len(inv.GPUs[0].MIG.Instances) != 0 {
		t.Fatalf("%d probes, instances %+v: want a second probe and no instance", probes, inv.GPUs[0].MIG.Instances)
	}
}

func migProfileNamed(t *testing.T, g hw.GPU, name string) hw.MIGProfile {
	t.Helper()
	for _, p := range g.MIG.Profiles {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("GPU %s has no MIG profile %s", g.PCIBusID, name)
	return hw.MIGProfile{}
}
