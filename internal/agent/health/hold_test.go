// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"reflect"
	"testing"

	"github.com/hwdra/hwdra/internal/hw"
)

func TestHold(t *testing.T) {
	a := hw.GPU{PCIBusID: gpuA, Index: 0, UUID: "GPU-a"}
	b := hw.GPU{PCIBusID: gpuB, Index: 1, UUID: "GPU-b"}
	up := hw.PF{PCIAddress: "0000:17:00.0", LinkUp: true, SpeedMbps: 400000}
	down := up
	down.LinkUp, down.SpeedMbps = false, 0
	for _, tc := range []struct {
		name            string
		prev, cur, want hw.Inventory
	}{{
		name: "a GPU that stopped answering is kept as it last answered",
		prev: hw.Inventory{GPUs: []hw.GPU{a, b}},
		cur:  hw.Inventory{GPUs: []hw.GPU{b}, UnreadableGPUs: []hw.UnreadableGPU{{Index: 0, PCIBusID: gpuA, Error: "x"}}},
		want: hw.Inventory{GPUs: []hw.GPU{a, b}, UnreadableGPUs: []hw.UnreadableGPU{{Index: 0, PCIBusID: gpuA, Error: "x"}}},
	}, {
		name: "a lost GPU, known by its index only",
		prev: hw.Inventory{GPUs: []hw.GPU{a, b}},
		cur:  hw.Inventory{GPUs: []hw.GPU{b}, UnreadableGPUs: []hw.UnreadableGPU{{Index: 0, Lost: true}}},
		want: hw.Inventory{GPUs: []hw.GPU{a, b}, UnreadableGPUs: []hw.UnreadableGPU{{Index: 0, Lost: true}}},
	}, {
		name: "never read: nothing to keep",
		cur:  hw.Inventory{GPUs: []hw.GPU{b}, UnreadableGPUs: []hw.UnreadableGPU{{Index: 0, Lost: true}}},
		want: hw.Inventory{GPUs: []hw.GPU{b}, UnreadableGPUs: []hw.UnreadableGPU{{Index: 0, Lost: true}}},
	}, {
		name: "gone from the bus: gone",
		prev: hw.Inventory{GPUs: []hw.GPU{a, b}},
		cur:  hw.Inventory{GPUs: []hw.GPU{b}},
		want: hw.Inventory{GPUs: []hw.GPU{b}},
	}, {
		name: "a link gone down keeps its last speed, across probes",
		prev: hw.Inventory{PFs: []hw.PF{up}},
		cur:  hw.Inventory{PFs: []hw.PF{down}},
		want: hw.Inventory{PFs: []hw.PF{func() hw.PF { p := down; p.LastSpeedMbps = 400000; return p }()}},
	}, {
		name: "still down",
		prev: hw.Inventory{PFs: []hw.PF{func() hw.PF { p := down; p.LastSpeedMbps = 400000; return p }()}},
		cur:  hw.Inventory{PFs: []hw.PF{down}},
		want: hw.Inventory{PFs: []hw.PF{func() hw.PF { p := down; p.LastSpeedMbps = 400000; return p }()}},
	}, {
		name: "back up: its own speed",
		prev: hw.Inventory{PFs: []hw.PF{func() hw.PF { p := down; p.LastSpeedMbps = 400000; return p }()}},
		cur:  hw.Inventory{PFs: []hw.PF{up}},
		want: hw.Inventory{PFs: []hw.PF{up}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Hold(tc.prev, tc.cur); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Hold:\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}
