// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package model

import (
	"reflect"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The mock's own GPU profiles must be self-consistent the way hardware
// tables are: placements in memory slices, the full profile covering the
// whole GPU, names matching NVIDIA's rounding.
func TestModelTables(t *testing.T) {
	for _, name := range GPUNames() {
		m, _ := LookupGPU(name)
		full := 0
		for _, p := range m.Profiles {
			if len(p.Starts) < p.Count {
				t.Errorf("%s %s: %d placements for %d instances", name, p.Name, len(p.Starts), p.Count)
			}
			for _, s := range p.Starts {
				if s+p.Size > m.MemSlices {
					t.Errorf("%s %s: placement %d+%d beyond %d memory slices", name, p.Name, s, p.Size, m.MemSlices)
				}
			}
			if p.Slices == m.ComputeSlices {
				full++
				if p.Size != m.MemSlices || p.MemMB > m.Config.MemoryMB {
					t.Errorf("%s %s: the full profile must cover all memory", name, p.Name)
				}
			}
			if p.MemMB*uint64(m.MemSlices) > m.Config.MemoryMB*uint64(p.Size) {
				t.Errorf("%s %s: %d MB is more than its %d/%d of the board", name, p.Name, p.MemMB, p.Size, m.MemSlices)
			}
		}
		if full != 1 {
			t.Errorf("%s: %d full-GPU profiles", name, full)
		}
	}
	want := map[string][]string{
		"a100-40gb":  {"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
		"a100-80gb":  {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
		"a30-24gb":   {"1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"},
		"h100-80gb":  {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
		"h200-141gb": {"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
		"b200-180gb": {"1g.23gb", "1g.23gb+me", "1g.45gb", "1g.23gb-me", "1g.23gb+me.all", "2g.45gb", "2g.45gb-me", "2g.45gb+me.all", "3g.90gb", "4g.90gb", "7g.180gb"},
	}
	for name, names := range want {
		if got := mustGPU(t, name).ProfileNames(); !reflect.DeepEqual(got, names) {
			t.Errorf("%s profiles: got %v, want %v", name, got, names)
		}
	}
}

func TestCIPlacements(t *testing.T) {
	for _, tc := range []struct {
		n, k   int
		starts []uint32
	}{
		{7, 1, []uint32{0, 1, 2, 3, 4, 5, 6}}, {7, 2, []uint32{0, 2, 4}}, {7, 3, []uint32{0, 4}},
		{7, 4, []uint32{0}}, {7, 7, []uint32{0}}, {3, 2, []uint32{0}}, {4, 2, []uint32{0, 2}},
	} {
		var got []uint32
		for _, p := range ciPlacements(tc.n, tc.k) {
			got = append(got, p.Start)
		}
		if !reflect.DeepEqual(got, tc.starts) {
			t.Errorf("ciPlacements(%d, %d): starts %v, want %v", tc.n, tc.k, got, tc.starts)
		}
	}
}

func mustGPU(t *testing.T, name string) *GPU {
	t.Helper()
	g, ok := LookupGPU(name)
	if !ok {
		t.Fatalf("no GPU model %s", name)
	}
	return g
}

// TestFits: placements overlap, instance counts and compute slices limit
// what joins a GPU's instances.
func TestFits(t *testing.T) {
	g := mustGPU(t, "h100-80gb")
	p := func(name string) MIGProfile {
		q, ok := g.ProfileByName(name)
		if !ok {
			t.Fatalf("no profile %s", name)
		}
		return q
	}
	at := func(start, size uint32) nvml.GpuInstancePlacement {
		return nvml.GpuInstancePlacement{Start: start, Size: size}
	}
	g3 := Placed{p("3g.40gb"), at(0, 4)}
	me := Placed{p("1g.10gb+me"), at(4, 1)}
	for _, tc := range []struct {
		name     string
		existing []Placed
		p        MIGProfile
		pl       nvml.GpuInstancePlacement
		want     nvml.Return
	}{
		{"empty GPU", nil, p("7g.80gb"), at(0, 8), nvml.SUCCESS},
		{"overlap", []Placed{g3}, p("1g.10gb"), at(3, 1), nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"beside", []Placed{g3}, p("3g.40gb"), at(4, 4), nvml.SUCCESS},
		{"instance count", []Placed{me}, p("1g.10gb+me"), at(5, 1), nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"compute slices", []Placed{{p("4g.40gb"), at(0, 4)}, {p("2g.20gb"), at(4, 2)}}, p("2g.20gb"), at(6, 2), nvml.ERROR_INSUFFICIENT_RESOURCES},
	} {
		if got := g.Fits(tc.existing, tc.p, tc.pl); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
