// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	nvmlmock "github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
)

// tripwireLib is an nvml.Interface whose Init answers init and whose every
// other function records its name and panics: on a node where Init failed
// any such call would kill the process.
func tripwireLib(init func() nvml.Return) (*nvmlmock.Interface, *[]string) {
	var mu sync.Mutex
	var called []string
	lib := &nvmlmock.Interface{}
	v := reflect.ValueOf(lib).Elem()
	for i := 0; i < v.NumField(); i++ {
		f, name := v.Field(i), v.Type().Field(i).Name
		if f.Kind() != reflect.Func || !f.CanSet() {
			continue
		}
		f.Set(reflect.MakeFunc(f.Type(), func([]reflect.Value) []reflect.Value {
			mu.Lock()
			called = append(called, name)
			mu.Unlock()
			panic("NVML called after a failed Init: " + name)
		}))
	}
	lib.InitFunc = init
	return lib, &called
}

func TestInitFailureCallsNothingElse(t *testing.T) {
	for name, init := range map[string]func() nvml.Return{
		"library missing":   func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND },
		"driver not loaded": func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED },
		"Init panics":       func() nvml.Return { panic("libnvidia-ml.so.1: cannot open shared object file") },
	} {
		t.Run(name, func(t *testing.T) {
			lib, called := tripwireLib(init)
			b := New(lib, WithSysfs(t.TempDir()))
			err := b.Init()
			if !errors.Is(err, ErrNoNVML) {
				t.Fatalf("Init: %v, want ErrNoNVML", err)
			}
			if !strings.Contains(err.Error(), "libnvidia-ml.so.1 not found; is the NVIDIA driver installed?") {
				t.Errorf("Init error %q does not tell the operator what to do", err)
			}
			if _, err := b.GPUs(context.Background()); !errors.Is(err, ErrNoNVML) {
				t.Errorf("GPUs after failed Init: %v, want ErrNoNVML", err)
			}
			if err := b.Shutdown(); err != nil {
				t.Errorf("Shutdown after failed Init: %v", err)
			}
			if len(*called) > 0 {
				t.Errorf("NVML functions called after a failed Init: %v", *called)
			}
		})
	}
}

func TestNotInitialised(t *testing.T) {
	lib, called := tripwireLib(func() nvml.Return { return nvml.SUCCESS })
	b := New(lib)
	if _, err := b.GPUs(context.Background()); !errors.Is(err, ErrNoNVML) {
		t.Errorf("GPUs before Init: %v", err)
	}
	if len(*called) > 0 {
		t.Errorf("NVML called before Init: %v", *called)
	}
}

func TestInitShutdown(t *testing.T) {
	h := mocktest.Open(t, dgxH100)
	b := New(h.NVML, WithSysfs(h.Sysfs))
	for i := 0; i < 2; i++ {
		if err := b.Init(); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GPUs(context.Background()); !errors.Is(err, ErrNoNVML) {
		t.Errorf("GPUs after Shutdown: %v", err)
	}
}

// dgxH100 is the GPU part of the dgx-h100 built-in profile.
const dgxH100 = "gpus: [{model: h100-80gb, count: 8}]"

func TestDeterministic(t *testing.T) {
	for _, profile := range []string{"h100-mig", "h100-vgpu", dgxH100,
		`gpus: [{model: a100-40gb, count: 4, numaNodes: [3, 3, 1, 1]}, {model: b200-180gb, count: 2}]`} {
		a, _ := inventory(t, profile)
		b, _ := inventory(t, profile)
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if string(ja) != string(jb) {
			t.Errorf("%s: two mocks of the same profile differ:\n%s\n%s", profile, ja, jb)
		}
	}
}

// failingLib fails one device call on one GPU.
type failingLib struct {
	nvml.Interface
	index int
	wrap  func(nvml.Device) nvml.Device
}

func (l failingLib) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	d, ret := l.Interface.DeviceGetHandleByIndex(i)
	if i == l.index {
		d = l.wrap(d)
	}
	return d, ret
}

type badMIGMode struct{ nvml.Device }

func (badMIGMode) GetMigMode() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_GPU_IS_LOST }

type badPCI struct{ nvml.Device }

func (badPCI) GetPciInfo() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, nvml.ERROR_UNKNOWN }

type unknownArch struct{ nvml.Device }

func (unknownArch) GetArchitecture() (nvml.DeviceArchitecture, nvml.Return) {
	return nvml.DEVICE_ARCH_UNKNOWN, nvml.SUCCESS
}

// A GPU of an architecture we do not know is assumed to need a reset for a
// MIG mode change.
func TestUnknownArchitecture(t *testing.T) {
	h := mocktest.Open(t, dgxH100)
	b := New(failingLib{h.NVML, 0, func(d nvml.Device) nvml.Device { return unknownArch{d} }}, WithSysfs(h.Sysfs))
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	gpus, err := b.GPUs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if g := gpus[0]; g.Architecture != "unknown" || g.MIG.SwitchWithoutReset || !gpus[1].MIG.SwitchWithoutReset {
		t.Errorf("unknown architecture: %q, switch without reset %v", g.Architecture, g.MIG.SwitchWithoutReset)
	}
}

type noNUMA struct{ nvml.Device }

func (noNUMA) GetNumaNodeId() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }

// TestDeviceErrorsNameTheGPU: a GPU that fails a query is named in the
// error and listed as unreadable; the other seven are read as usual.
func TestDeviceErrorsNameTheGPU(t *testing.T) {
	h := mocktest.Open(t, dgxH100)
	for _, tc := range []struct {
		wrap func(nvml.Device) nvml.Device
		msg  string
		ret  nvml.Return
		want hw.UnreadableGPU
	}{
		{func(d nvml.Device) nvml.Device { return badMIGMode{d} }, "GPU 1 (0000:43:00.0): GetMigMode: ERROR_GPU_IS_LOST", nvml.ERROR_GPU_IS_LOST,
			hw.UnreadableGPU{Index: 1, PCIBusID: "0000:43:00.0", Lost: true, Error: "GPU 1 (0000:43:00.0): GetMigMode: ERROR_GPU_IS_LOST"}},
		{func(d nvml.Device) nvml.Device { return badPCI{d} }, "GPU 1: GetPciInfo: ERROR_UNKNOWN", nvml.ERROR_UNKNOWN,
			hw.UnreadableGPU{Index: 1, Error: "GPU 1: GetPciInfo: ERROR_UNKNOWN"}},
	} {
		b := New(failingLib{h.NVML, 1, tc.wrap}, WithSysfs(h.Sysfs))
		if err := b.Init(); err != nil {
			t.Fatal(err)
		}
		gpus, err := b.GPUs(context.Background())
		if err == nil || err.Error() != tc.msg || !errors.Is(err, tc.ret) {
			t.Errorf("GPUs: %v, want %q wrapping %v", err, tc.msg, tc.ret)
		}
		if got := Unreadable(fmt.Errorf("probe: %w", err)); len(got) != 1 || got[0] != tc.want {
			t.Errorf("unreadable %+v, want %+v", got, tc.want)
		}
		if len(gpus) != 7 || slices.ContainsFunc(gpus, func(g hw.GPU) bool { return g.Index == 1 }) {
			t.Errorf("%d GPUs read besides the failing one, want the other 7", len(gpus))
		}
	}
}

func TestNUMAFallsBackToSysfs(t *testing.T) {
	h := mocktest.Open(t, `gpus: [{model: h100-80gb, count: 2, numaNodes: [1, -1]}]`)
	for i, want := range []int{1, -1} {
		b := New(failingLib{h.NVML, i, func(d nvml.Device) nvml.Device { return noNUMA{d} }}, WithSysfs(h.Sysfs))
		if err := b.Init(); err != nil {
			t.Fatal(err)
		}
		gpus, err := b.GPUs(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if gpus[i].NUMANode != want {
			t.Errorf("GPU %d NUMA from sysfs: %d, want %d", i, gpus[i].NUMANode, want)
		}
	}
	// Without sysfs either, the node is unknown.
	b := New(failingLib{h.NVML, 0, func(d nvml.Device) nvml.Device { return noNUMA{d} }}, WithSysfs(t.TempDir()))
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	gpus, err := b.GPUs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if gpus[0].NUMANode != -1 || gpus[0].PCIeRoot != "" {
		t.Errorf("no sysfs: NUMA %d, PCIe root %q; want -1 and empty", gpus[0].NUMANode, gpus[0].PCIeRoot)
	}
}

func TestCancelled(t *testing.T) {
	h := mocktest.Open(t, dgxH100)
	b := New(h.NVML, WithSysfs(h.Sysfs))
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.GPUs(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("GPUs with a cancelled context: %v", err)
	}
}

func TestBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0",
		"0000:3b:00.0":     "0000:3b:00.0",
		"00000001:C1:1F.7": "0001:c1:1f.7",
		"3B:00.0":          "",
		"00000000:3B:00":   "",
		"00010000:3B:00.0": "",
		"0000:3b:20.0":     "",
	} {
		got, err := canonicalBusID(in)
		if got != want || (err == nil) != (want != "") {
			t.Errorf("canonicalBusID(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestMigGB(t *testing.T) {
	for _, tc := range []struct {
		totalMB, profileMB uint64
		want               int
	}{
		{40960, 4864, 5}, {40960, 9856, 10}, {40960, 19968, 20}, {40960, 40192, 40},
		{81920, 10240, 10}, {81920, 9984, 10}, {81920, 20096, 20}, {81920, 81152, 80},
		{144384, 16384, 18}, {144384, 32896, 35}, {144384, 66304, 71}, {144384, 133120, 141},
		{184320, 22400, 23}, {24576, 5836, 6},
	} {
		if got := migGB(tc.totalMB<<20, tc.profileMB); got != tc.want {
			t.Errorf("migGB(%d MB of %d MB) = %d, want %d", tc.profileMB, tc.totalMB, got, tc.want)
		}
	}
}
