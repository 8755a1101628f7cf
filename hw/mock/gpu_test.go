package mock

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

func TestGPUGroupValidate(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown model", "gpus: [{model: x100, count: 1}]",
			`gpus[0].model: unknown GPU model "x100" (known: a100-40gb, a100-80gb, a30-24gb, b200-180gb, h100-80gb, h200-141gb)`},
		{"no count", "gpus: [{model: h100-80gb}]", "gpus[0].count: must be at least 1"},
		{"bus IDs vs count", `gpus: [{model: h100-80gb, count: 8, pciBusIDs: ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]}]`,
			"gpus[0].pciBusIDs: has 3 entries, count is 8"},
		{"bad bus ID", `gpus: [{model: h100-80gb, count: 1, pciBusIDs: ["00000000:1B:00.0"]}]`,
			`gpus[0].pciBusIDs[0]: "00000000:1B:00.0" is not a lower-case PCI address`},
		{"duplicate bus ID", `gpus: [{model: h100-80gb, count: 2, pciBusIDs: ["0000:1b:00.0", "0000:1b:00.0"]}]`,
			"gpus[0].pciBusIDs[1]: 0000:1b:00.0 is also pciBusIDs[0]"},
		{"NUMA vs count", "gpus: [{model: h100-80gb, count: 2, numaNodes: [0]}]", "gpus[0].numaNodes: has 1 entries, count is 2"},
		{"bad NUMA", "gpus: [{model: h100-80gb, count: 1, numaNodes: [-2]}]", "gpus[0].numaNodes[0]: -2 is not a NUMA node"},
		{"instances without MIG", "gpus: [{model: h100-80gb, count: 1, migInstances: [{profile: 3g.40gb}]}]",
			"gpus[0].migInstances: need mig: true"},
		{"unknown profile", "gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.40gb}, {profile: 9g.1gb}]}]",
			`gpus[0].migInstances[1]: profile "9g.1gb" not offered by h100-80gb (offered: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)`},
		{"A100 name on H100", "gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.20gb}]}]",
			`profile "3g.20gb" not offered by h100-80gb`},
		{"start not a placement", "gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.40gb, start: 3}]}]",
			"gpus[0].migInstances[0]: start 3 is not a placement of 3g.40gb on h100-80gb (starts: 0 4)"},
		{"overlap", "gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.40gb}, {profile: 1g.10gb, start: 2}]}]",
			"gpus[0].migInstances[1]: 1g.10gb at 2 overlaps migInstances[0] (3g.40gb at 0)"},
		{"instance count", "gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 1g.10gb+me}, {profile: 1g.10gb+me, start: 1}]}]",
			"gpus[0].migInstances[1]: no room for 1g.10gb+me on h100-80gb (at most 1 instances"},
		{"bad virtualization", "gpus: [{model: h100-80gb, count: 1, virtualization: vgpu}]",
			`gpus[0].virtualization: unknown mode "vgpu" (known: none, host-vgpu)`},
		{"types without vGPU", "gpus: [{model: h100-80gb, count: 1, vgpuTypes: [{name: x, framebufferMB: 1, maxInstances: 1}]}]",
			"gpus[0].vgpuTypes: need virtualization: host-vgpu"},
		{"heterogeneous on Ampere", "gpus: [{model: a100-40gb, count: 1, virtualization: host-vgpu, vgpuHeterogeneous: true}]",
			"gpus[0].vgpuHeterogeneous: a100-40gb has no heterogeneous vGPU mode"},
		{"vGPU type profile", "gpus: [{model: h100-80gb, count: 1, virtualization: host-vgpu, vgpuTypes: [{name: x, framebufferMB: 1, maxInstances: 1, migProfile: 1g.5gb}]}]",
			`gpus[0].vgpuTypes[0].migProfile: "1g.5gb" not offered by h100-80gb`},
		{"vGPU type size", "gpus: [{model: h100-80gb, count: 1, virtualization: host-vgpu, vgpuTypes: [{name: x, maxInstances: 1}]}]",
			"gpus[0].vgpuTypes[0].framebufferMB: must be more than 0"},
		{"unknown field", "gpus: [{model: h100-80gb, count: 1, colour: green}]", `gpus[0].colour: unknown field`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("t", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse: got error %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

func TestGPUGroupValidateAccepts(t *testing.T) {
	for _, y := range []string{
		"gpus: [{model: a30-24gb, count: 1, mig: true, migInstances: [{profile: 2g.12gb+me}, {profile: 1g.6gb, start: 2}]}]",
		"gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 4g.40gb}, {profile: 2g.20gb, start: 4}, {profile: 1g.10gb, start: 6}]}]",
		"gpus: [{model: h100-80gb, count: 2, virtualization: host-vgpu, vgpuTypes: [{name: NVIDIA H100-1-10C, framebufferMB: 9984, maxInstances: 7, migProfile: 1g.10gb}]}]",
	} {
		if _, err := Parse("t", []byte(y)); err != nil {
			t.Errorf("Parse(%s): %v", y, err)
		}
	}
}

// The mock's own GPU profiles must be self-consistent the way hardware
// tables are: placements in memory slices, the full profile covering the
// whole GPU, names matching NVIDIA's rounding.
func TestModelTables(t *testing.T) {
	for _, name := range Models() {
		m := models[name]
		full := 0
		for _, p := range m.profiles {
			if len(p.starts) < p.count {
				t.Errorf("%s %s: %d placements for %d instances", name, p.name, len(p.starts), p.count)
			}
			for _, s := range p.starts {
				if s+p.size > m.memSlices {
					t.Errorf("%s %s: placement %d+%d beyond %d memory slices", name, p.name, s, p.size, m.memSlices)
				}
			}
			if p.slices == m.computeSlices {
				full++
				if p.size != m.memSlices || p.memMB > m.config.MemoryMB {
					t.Errorf("%s %s: the full profile must cover all memory", name, p.name)
				}
			}
			if p.memMB*uint64(m.memSlices) > m.config.MemoryMB*uint64(p.size) {
				t.Errorf("%s %s: %d MB is more than its %d/%d of the board", name, p.name, p.memMB, p.size, m.memSlices)
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
		if got := models[name].profileNames(); !reflect.DeepEqual(got, names) {
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

func TestBuiltinGPUProfiles(t *testing.T) {
	for name, want := range map[string]struct {
		gpus int
		mig  bool
	}{
		"dgx-a100": {8, false}, "dgx-h100": {8, false}, "dgx-h200": {8, false},
		"h100-vgpu": {2, false}, "h100-mig": {8, true},
	} {
		h, err := Open(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		n, _ := h.NVML.DeviceGetCount()
		dev, _ := h.NVML.DeviceGetHandleByIndex(0)
		cur, _, _ := dev.GetMigMode()
		if n != want.gpus || (cur == nvml.DEVICE_MIG_ENABLE) != want.mig {
			t.Errorf("%s: %d GPUs, MIG mode %d; want %d, MIG %v", name, n, cur, want.gpus, want.mig)
		}
		if err := h.Close(); err != nil {
			t.Error(err)
		}
	}
}

func TestLayoutAndSysfs(t *testing.T) {
	h := newHW(t, "gpus: [{model: h100-80gb, count: 8}]")
	roots := map[string]bool{}
	for i, addr := range dgxBusIDs {
		dev, _ := h.NVML.DeviceGetHandleByIndex(i)
		numa, _ := dev.GetNumaNodeId()
		if want := i / 4; numa != want {
			t.Errorf("GPU %d: NUMA %d, want %d", i, numa, want)
		}
		link := filepath.Join(h.Sysfs, "bus/pci/devices", addr)
		target, err := os.Readlink(link)
		if err != nil {
			t.Fatal(err)
		}
		root := strings.Split(strings.TrimPrefix(filepath.Clean(filepath.Join("bus/pci/devices", target)), "devices/"), "/")[0]
		if i%2 == 0 {
			if roots[root] {
				t.Errorf("GPU %d: PCIe root %s shared with another pair", i, root)
			}
			roots[root] = true
		} else if !roots[root] {
			t.Errorf("GPU %d: PCIe root %s differs from its pair's", i, root)
		}
		for file, want := range map[string]string{"vendor": "0x10de\n", "device": "0x2330\n", "class": "0x030200\n"} {
			if b, _ := os.ReadFile(filepath.Join(link, file)); string(b) != want {
				t.Errorf("%s/%s = %q, want %q", addr, file, b, want)
			}
		}
		if drv, _ := os.Readlink(filepath.Join(link, "driver")); filepath.Base(drv) != "nvidia" {
			t.Errorf("%s: driver %q", addr, drv)
		}
	}
}

func TestDeterministicUUIDs(t *testing.T) {
	uuids := func(y string) []string {
		h := newHW(t, y)
		var out []string
		for i := 0; i < 2; i++ {
			dev, _ := h.NVML.DeviceGetHandleByIndex(i)
			id, _ := dev.GetUUID()
			out = append(out, id)
		}
		return out
	}
	a := uuids("gpus: [{model: h100-80gb, count: 2}]")
	b := uuids("gpus: [{model: h100-80gb, count: 2}]")
	c := uuids(`gpus: [{model: h100-80gb, count: 2, pciBusIDs: ["0000:1b:00.0", "0000:44:00.0"]}]`)
	if !reflect.DeepEqual(a, b) || a[0] == a[1] || !strings.HasPrefix(a[0], "GPU-") {
		t.Errorf("UUIDs not stable and distinct: %v vs %v", a, b)
	}
	if a[0] != c[0] || a[1] == c[1] {
		t.Errorf("UUIDs must follow the bus ID: %v vs %v", a, c)
	}
}

func TestNoGPUsMeansNoNVML(t *testing.T) {
	if ret := noNVML().Init(); ret != nvml.ERROR_LIBRARY_NOT_FOUND {
		t.Errorf("Init: %v", ret)
	}
}

// newHW builds a mock from a profile snippet and closes it with the test.
func newHW(t *testing.T, y string) *Hardware {
	t.Helper()
	p, err := Parse(t.Name(), []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// device is the test's handle on the i-th mock GPU.
func device(t *testing.T, h *Hardware, i int) *gpuDevice {
	t.Helper()
	return h.NVML.(*server.Server).Devices[i].(*gpuDevice)
}
