// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/mock/nodefs"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/mock/profile"
)

func TestBuiltinGPUProfiles(t *testing.T) {
	for name, want := range map[string]struct {
		gpus int
		mig  bool
	}{
		"dgx-a100": {8, false}, "dgx-h100": {8, false}, "dgx-h200": {8, false},
		"h100-vgpu": {2, false}, "h100-mig": {8, true},
	} {
		h := build(t, name)
		n, _ := h.NVML.DeviceGetCount()
		dev, _ := h.NVML.DeviceGetHandleByIndex(0)
		cur, _, _ := dev.GetMigMode()
		if n != want.gpus || (cur == nvml.DEVICE_MIG_ENABLE) != want.mig {
			t.Errorf("%s: %d GPUs, MIG mode %d; want %d, MIG %v", name, n, cur, want.gpus, want.mig)
		}
	}
}

func TestLayoutAndSysfs(t *testing.T) {
	h := build(t, "gpus: [{model: h100-80gb, count: 8}]")
	roots := map[string]bool{}
	for i, addr := range dgxBusIDs {
		dev, _ := h.NVML.DeviceGetHandleByIndex(i)
		numa, _ := dev.GetNumaNodeId()
		if want := i / 4; numa != want {
			t.Errorf("GPU %d: NUMA %d, want %d", i, numa, want)
		}
		link := filepath.Join(h.sysfs, "bus/pci/devices", addr)
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

// TestDefaultAddressesToTheLimit: every GPU the profile's validation
// lets go without pciBusIDs gets a valid address NVML reports, behind
// GPUs with explicit ones.
func TestDefaultAddressesToTheLimit(t *testing.T) {
	h := build(t, fmt.Sprintf(`gpus: [{model: a30-24gb, count: 1, pciBusIDs: ["0000:05:00.0"]}, {model: h100-80gb, count: %d}]`,
		profile.MaxDefaultGPUAddresses))
	n, _ := h.NVML.DeviceGetCount()
	if n != profile.MaxDefaultGPUAddresses+1 {
		t.Fatalf("%d GPUs", n)
	}
	seen := map[string]bool{}
	for i := range n {
		dev, _ := h.NVML.DeviceGetHandleByIndex(i)
		info, ret := dev.GetPciInfo()
		if ret != nvml.SUCCESS {
			t.Fatalf("GPU %d: GetPciInfo: %v", i, ret)
		}
		id := cStr(info.BusId[:])
		if seen[id] {
			t.Errorf("GPU %d: bus ID %s twice", i, id)
		}
		seen[id] = true
	}
	if !seen["00000000:FF:00.0"] {
		t.Errorf("the last default address is not bus ff: %v", seen)
	}
}

func TestDeterministicUUIDs(t *testing.T) {
	uuids := func(y string) []string {
		h := build(t, y)
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

// testGPUs are GPUs built for a test, with their trees.
type testGPUs struct {
	*GPUs
	sysfs, proc, dev string
}

// build builds the GPUs of a built-in profile or a profile's YAML (given
// by its colon) in a directory removed with the test.
func build(t *testing.T, spec string) *testGPUs {
	t.Helper()
	p, err := profile.ParseOrLoad(t.Name(), spec)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := persist.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &testGPUs{sysfs: filepath.Join(dir, "sys"), proc: filepath.Join(dir, "proc"), dev: filepath.Join(dir, "dev")}
	if h.GPUs, err = Build(p, h.sysfs, h.proc, nodefs.NewDev(h.dev), persist.Discard); err != nil {
		t.Fatal(err)
	}
	return h
}

// device is the test's handle on the i-th mock GPU.
func device(t *testing.T, h *testGPUs, i int) *gpu {
	t.Helper()
	return h.all()[i]
}
