// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
	"github.com/hwdra/hwdra/internal/mock/model"
)

// inventory reads a mock profile through the backend.
func inventory(t *testing.T, profile string) ([]hw.GPU, *mock.Hardware) {
	t.Helper()
	h := mocktest.Open(t, profile)
	b := New(h.NVML, WithSysfs(h.Sysfs))
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	gpus, err := b.GPUs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return gpus, h
}

// modelWant is what real hardware of a model reports.
type modelWant struct {
	product, arch, cc string
	deviceID          uint32
	memBytes          uint64
	memSlices         int
	reset             bool     // MIG mode change needs a GPU reset
	profiles          []string // by GPU_INSTANCE_PROFILE_* index
	full              hw.Placement
}

var modelWants = map[string]modelWant{
	"a100-40gb": {"NVIDIA A100-SXM4-40GB", "ampere", "8.0", 0x20B010DE, 40 << 30, 8, true,
		[]string{"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.5gb+me", "1g.10gb"}, hw.Placement{Start: 0, Size: 8}},
	"a100-80gb": {"NVIDIA A100-SXM4-80GB", "ampere", "8.0", 0x20B210DE, 80 << 30, 8, true,
		[]string{"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me", "1g.20gb"}, hw.Placement{Start: 0, Size: 8}},
	"a30-24gb": {"NVIDIA A30-PCIE-24GB", "ampere", "8.0", 0x20B710DE, 24 << 30, 4, true,
		[]string{"1g.6gb", "2g.12gb", "4g.24gb", "1g.6gb+me", "2g.12gb+me"}, hw.Placement{Start: 0, Size: 4}},
	"h100-80gb": {"NVIDIA H100 80GB HBM3", "hopper", "9.0", 0x233010DE, 80 << 30, 8, false,
		[]string{"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me", "1g.20gb"}, hw.Placement{Start: 0, Size: 8}},
	// As a real H200 reports itself (internal/mock/model/testdata/probe-h200.yaml).
	"h200-141gb": {"NVIDIA H200", "hopper", "9.0", 0x233510DE, 150754820096, 8, false,
		[]string{"1g.18gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", "1g.18gb+me", "1g.35gb"}, hw.Placement{Start: 0, Size: 8}},
	"b200-180gb": {"NVIDIA B200 180GB HBM3e", "blackwell", "10.0", 0x2B0010DE, 180 << 30, 8, false,
		[]string{"1g.23gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb", "1g.23gb+me", "1g.45gb",
			"1g.23gb-me", "2g.45gb-me", "1g.23gb+me.all", "2g.45gb+me.all"}, hw.Placement{Start: 0, Size: 8}},
}

func TestGPUsEveryModel(t *testing.T) {
	if got := model.GPUNames(); len(got) != len(modelWants) {
		t.Fatalf("mock models %v: test covers %d", got, len(modelWants))
	}
	for _, model := range model.GPUNames() {
		t.Run(model, func(t *testing.T) {
			w := modelWants[model]
			gpus, _ := inventory(t, "gpus: [{model: "+model+", count: 2}]")
			if len(gpus) != 2 {
				t.Fatalf("%d GPUs", len(gpus))
			}
			for i, g := range gpus {
				checkGPU(t, i, g, w)
			}
		})
	}
}

func checkGPU(t *testing.T, i int, g hw.GPU, w modelWant) {
	t.Helper()
	busIDs := []string{"0000:1b:00.0", "0000:43:00.0"}
	if !strings.HasPrefix(g.UUID, "GPU-") || g.ProductName != w.product || g.PCIBusID != busIDs[i] ||
		g.PCIDeviceID != w.deviceID || g.Index != i || g.Minor != i || g.MemoryBytes != w.memBytes ||
		g.Architecture != w.arch || g.CUDAComputeCapability != w.cc || g.NUMANode != 0 || g.PCIeRoot != "pci0000:10" ||
		g.Virtualization != hw.VirtualizationNone {
		t.Errorf("GPU %d identity: %+v", i, g)
	}
	if w.arch == "blackwell" {
		if g.DriverVersion != "570.133.20" || g.CUDADriverVersion != "12.8" {
			t.Errorf("driver %s CUDA %s", g.DriverVersion, g.CUDADriverVersion)
		}
	} else if g.DriverVersion != "550.54.15" || g.CUDADriverVersion != "12.4" {
		t.Errorf("driver %s CUDA %s", g.DriverVersion, g.CUDADriverVersion)
	}
	m := g.MIG
	if !m.Capable || m.Enabled || m.Pending || m.SwitchWithoutReset == w.reset || m.MemorySlices != w.memSlices || m.Instances != nil {
		t.Errorf("GPU %d MIG state: %+v", i, m)
	}
	var names []string
	lastID := -1
	for _, p := range m.Profiles {
		names = append(names, p.Name)
		if p.ID <= lastID {
			t.Errorf("profiles not sorted by ID: %d after %d", p.ID, lastID)
		}
		lastID = p.ID
		if len(p.Placements) < p.InstanceCount || p.MemoryBytes == 0 || p.Multiprocessors == 0 {
			t.Errorf("profile %s: %+v", p.Name, p)
		}
		for j, pl := range p.Placements {
			if pl.Start+pl.Size > w.memSlices || (j > 0 && pl.Start <= p.Placements[j-1].Start) {
				t.Errorf("profile %s placements %v: not sorted memory-slice ranges", p.Name, p.Placements)
			}
		}
		if strings.HasSuffix(p.Name, "+me") && (p.ID != nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1 && p.ID != nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1 || p.OFAEngines != 1 || p.InstanceCount != 1) {
			t.Errorf("media-extension profile %s: %+v", p.Name, p)
		}
	}
	want := append([]string(nil), w.profiles...)
	if !reflect.DeepEqual(names, want) {
		t.Errorf("GPU %d profiles %v, want %v", i, names, want)
	}
	full, _ := m.Profile(nvml.GPU_INSTANCE_PROFILE_7_SLICE)
	if w.memSlices == 4 {
		full, _ = m.Profile(nvml.GPU_INSTANCE_PROFILE_4_SLICE)
	}
	if !reflect.DeepEqual(full.Placements, []hw.Placement{w.full}) {
		t.Errorf("full-GPU profile placements %v, want %v (memory slices, not compute slices)", full.Placements, w.full)
	}
}

// The names NVML's v3 profile info carries must match the ones computed
// from v1 info, on every model: a GPU whose driver lacks v3 gets the same
// device names.
func TestComputedProfileNames(t *testing.T) {
	for _, model := range model.GPUNames() {
		h := mocktest.Open(t, "gpus: [{model: "+model+", count: 1}]")
		plain := failingLib{h.NVML, 0, func(d nvml.Device) nvml.Device { return struct{ nvml.Device }{d} }}
		var got [2][]hw.MIGProfile
		for k, lib := range []nvml.Interface{h.NVML, plain} {
			b := New(lib, WithSysfs(h.Sysfs))
			if err := b.Init(); err != nil {
				t.Fatal(err)
			}
			gpus, err := b.GPUs(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			got[k] = gpus[0].MIG.Profiles
		}
		if !reflect.DeepEqual(got[0], got[1]) {
			t.Errorf("%s: v3 and computed profiles differ:\n%+v\n%+v", model, got[0], got[1])
		}
	}
}

func TestExistingInstances(t *testing.T) {
	gpus, _ := inventory(t, "h100-mig")
	for _, g := range gpus {
		m := g.MIG
		if !m.Enabled || !m.Pending || len(m.Instances) != 1 {
			t.Fatalf("%s: MIG %v/%v with %d instances", g.PCIBusID, m.Enabled, m.Pending, len(m.Instances))
		}
		gi := m.Instances[0]
		if gi.ProfileID != nvml.GPU_INSTANCE_PROFILE_3_SLICE || gi.Placement != (hw.Placement{Start: 0, Size: 4}) ||
			len(gi.ComputeInstances) != 1 || gi.ComputeInstances[0].ProfileID != nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE ||
			!strings.HasPrefix(gi.ComputeInstances[0].UUID, "MIG-") {
			t.Errorf("%s: instance %+v", g.PCIBusID, gi)
		}
		p, _ := m.Profile(gi.ProfileID)
		var cps []int
		for _, c := range p.ComputeProfiles {
			cps = append(cps, c.Slices)
		}
		if p.Name != "3g.40gb" || !reflect.DeepEqual(cps, []int{1, 2, 3}) {
			t.Errorf("%s: profile %s compute profiles of %v slices, want 1, 2, 3", g.PCIBusID, p.Name, cps)
		}
	}
	if gpus[0].MIG.Instances[0].ComputeInstances[0].UUID == gpus[1].MIG.Instances[0].ComputeInstances[0].UUID {
		t.Error("two GPUs' MIG devices share a UUID")
	}
}

// Instances are sorted by placement, whatever order they were made in.
func TestInstancesSortedByPlacement(t *testing.T) {
	gpus, _ := inventory(t, `gpus: [{model: a100-40gb, count: 1, mig: true, migInstances: [
	  {profile: 1g.5gb, start: 6}, {profile: 3g.20gb, start: 0}, {profile: 1g.5gb+me, start: 4}]}]`)
	var got []string
	for _, gi := range gpus[0].MIG.Instances {
		p, _ := gpus[0].MIG.Profile(gi.ProfileID)
		got = append(got, p.Name)
	}
	if want := []string{"3g.20gb", "1g.5gb+me", "1g.5gb"}; !reflect.DeepEqual(got, want) {
		t.Errorf("instances %v, want %v", got, want)
	}
}

func TestVGPUTypes(t *testing.T) {
	gpus, _ := inventory(t, "h100-vgpu")
	for _, g := range gpus {
		if g.Virtualization != hw.VirtualizationHostVGPU || !g.VGPU.Heterogeneous {
			t.Fatalf("%s: %s heterogeneous %v", g.PCIBusID, g.Virtualization, g.VGPU.Heterogeneous)
		}
		types := map[string]hw.VGPUType{}
		for _, vt := range g.VGPU.Types {
			types[vt.Name] = vt
		}
		for name, w := range map[string]struct {
			profile string // "" for time-sliced
			fbMB    uint64
			max     int
		}{
			"NVIDIA H100-80C":   {"", 81920, 1},
			"NVIDIA H100-5C":    {"", 5120, 16},
			"NVIDIA H100-1-10C": {"1g.10gb", 9984, 7},
			"NVIDIA H100-1-20C": {"1g.20gb", 20096, 4},
			"NVIDIA H100-2-20C": {"2g.20gb", 20096, 3},
			"NVIDIA H100-3-40C": {"3g.40gb", 40448, 2},
			"NVIDIA H100-4-40C": {"4g.40gb", 40448, 1},
			"NVIDIA H100-7-80C": {"7g.80gb", 81152, 1},
		} {
			vt, ok := types[name]
			if !ok {
				t.Errorf("%s: no vGPU type %s", g.PCIBusID, name)
				continue
			}
			profile := ""
			if vt.GPUInstanceProfileID != nil {
				p, _ := g.MIG.Profile(*vt.GPUInstanceProfileID)
				profile = p.Name
			}
			if profile != w.profile || vt.FramebufferBytes != w.fbMB<<20 || vt.MaxInstances != w.max || vt.Class != "Compute" {
				t.Errorf("%s: %s on profile %q: %+v, want %+v", g.PCIBusID, name, profile, vt, w)
			}
		}
	}
	plain, _ := inventory(t, "gpus: [{model: a100-40gb, count: 1, virtualization: host-vgpu}]")
	if v := plain[0].VGPU; v.Heterogeneous || len(v.Types) == 0 {
		t.Errorf("A100 vGPU: %+v (no heterogeneous mode on Ampere)", v)
	}
}
