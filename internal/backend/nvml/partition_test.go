// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
)

func backend(t *testing.T, profile string) (*Backend, *mock.Hardware) {
	t.Helper()
	h := mocktest.Open(t, profile)
	b := New(h.NVML, WithSysfs(h.Sysfs))
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Shutdown() })
	return b, h
}

const h100 = "0000:1b:00.0"

func capsFile(h *mock.Hardware, minor int, gi int, ci ...int) string {
	p := fmt.Sprintf("driver/nvidia/capabilities/gpu%d/mig/gi%d", minor, gi)
	for _, c := range ci {
		p += fmt.Sprintf("/ci%d", c)
	}
	return filepath.Join(h.ProcRoot(), p, "access")
}

func TestMIGLifecycle(t *testing.T) {
	b, h := backend(t, "gpus: [{model: h100-80gb, count: 1}]")
	g4 := hw.Placement{Start: 0, Size: 4}
	_, err := b.CreateGPUInstance(h100, nvml.GPU_INSTANCE_PROFILE_4_SLICE, g4)
	if !errors.Is(err, nvml.ERROR_NOT_SUPPORTED) || !strings.Contains(err.Error(), "GPU 0 (0000:1b:00.0): CreateGpuInstanceWithPlacement") {
		t.Fatalf("create with MIG off: %v", err)
	}
	if err := b.SetMIGMode(h100, true); err != nil {
		t.Fatal(err)
	}
	gi, err := b.CreateGPUInstance(h100, nvml.GPU_INSTANCE_PROFILE_4_SLICE, g4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateGPUInstance(h100, nvml.GPU_INSTANCE_PROFILE_1_SLICE, hw.Placement{Start: 2, Size: 1}); !errors.Is(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
		t.Errorf("overlapping create: %v", err)
	}
	if _, err := b.CreateComputeInstance(h100, gi, 3); err == nil || !strings.Contains(err.Error(), "no compute instance of 3 slices (it offers [1 2 4])") {
		t.Errorf("3 slices in a 4g: %v", err)
	}
	small, err := b.CreateComputeInstance(h100, gi, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.CreateComputeInstance(h100, gi, 0)
	if !errors.Is(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
		t.Errorf("whole-GI CI next to a 1-slice one: %v", err)
	}
	if err := b.DestroyComputeInstance(h100, gi, small); err != nil {
		t.Fatal(err)
	}
	whole, err := b.CreateComputeInstance(h100, gi, 0)
	if err != nil {
		t.Fatal(err)
	}
	list, err := b.GPUInstances(h100)
	if err != nil || len(list) != 1 || list[0].ID != gi || list[0].Placement != g4 || len(list[0].ComputeInstances) != 1 ||
		list[0].ComputeInstances[0].ProfileID != nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE {
		t.Fatalf("instances %+v, %v", list, err)
	}
	uuid, err := b.MIGDeviceUUID(h100, gi, whole)
	if err != nil || uuid != list[0].ComputeInstances[0].UUID || !strings.HasPrefix(uuid, "MIG-") {
		t.Errorf("MIG UUID %q (listed %q): %v", uuid, list[0].ComputeInstances[0].UUID, err)
	}
	for _, f := range []string{capsFile(h, 0, gi), capsFile(h, 0, gi, whole)} {
		if b, err := os.ReadFile(f); err != nil || !strings.HasPrefix(string(b), "DeviceFileMinor: ") {
			t.Errorf("%s: %q %v", f, b, err)
		}
	}
	if err := b.SetMIGMode(h100, false); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "1 GPU instances exist") {
		t.Errorf("MIG off with an instance: %v", err)
	}
	if err := b.DestroyGPUInstance(h100, gi); !errors.Is(err, nvml.ERROR_IN_USE) {
		t.Errorf("destroy GI with a CI: %v", err)
	}
	if err := b.DestroyComputeInstance(h100, gi, whole); err != nil {
		t.Fatal(err)
	}
	if err := b.DestroyGPUInstance(h100, gi); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(capsFile(h, 0, gi)); !os.IsNotExist(err) {
		t.Errorf("capability of a destroyed GI left: %v", err)
	}
	for name, err := range map[string]error{
		"destroy GI again": b.DestroyGPUInstance(h100, gi),
		"destroy CI again": b.DestroyComputeInstance(h100, gi, whole),
	} {
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", name, err)
		}
	}
	if _, err := b.MIGDeviceUUID(h100, gi, whole); !errors.Is(err, ErrNotFound) {
		t.Errorf("UUID of a destroyed MIG device: %v", err)
	}
	if list, err := b.GPUInstances(h100); err != nil || len(list) != 0 {
		t.Errorf("instances after destroy: %+v %v", list, err)
	}
	if _, err := b.Minor("0000:99:00.0"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown GPU: %v", err)
	}
}

func TestSetMIGModeRefusals(t *testing.T) {
	b, h := backend(t, `gpus: [{model: a100-40gb, count: 1, pciBusIDs: ["0000:07:00.0"]}, {model: h100-80gb, count: 1}]`)
	if err := b.SetMIGMode("0000:07:00.0", true); !errors.Is(err, ErrResetRequired) || !strings.Contains(err.Error(), "ampere") {
		t.Errorf("Ampere: %v", err)
	}
	if err := b.SetMIGMode("0000:07:00.0", false); err != nil {
		t.Errorf("Ampere, already off: %v", err)
	}
	h.SetRunningProcesses(h100, 4242)
	if err := b.SetMIGMode(h100, true); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "1 processes run") {
		t.Errorf("busy Hopper: %v", err)
	}
	h.SetRunningProcesses(h100)
	if err := b.SetMIGMode(h100, true); err != nil {
		t.Fatal(err)
	}
	if err := b.SetMIGMode(h100, false); err != nil {
		t.Fatal(err)
	}
	if gpus := mustGPUs(t, b); gpus[1].MIG.Enabled {
		t.Error("MIG still on")
	}
}

func mustGPUs(t *testing.T, b *Backend) []hw.GPU {
	t.Helper()
	gpus, err := b.GPUs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return gpus
}

func TestMdevLifecycle(t *testing.T) {
	b, h := backend(t, "h100-vgpu")
	gpus := mustGPUs(t, b)
	types := map[string]hw.VGPUType{}
	for _, vt := range gpus[0].VGPU.Types {
		types[vt.Name] = vt
	}
	m := NewMdevs(h.Sysfs, h.SysfsWriter())
	ts, mb := types["NVIDIA H100-10C"], types["NVIDIA H100-1-10C"]

	if _, err := m.Parent(h100, mb.ID); err == nil || !strings.Contains(err.Error(), "no room") {
		t.Errorf("MIG-backed type with MIG off: %v", err)
	}
	parent, err := m.Parent(h100, ts.ID)
	if err != nil || parent != "0000:1b:00.4" {
		t.Fatalf("parent %q: %v", parent, err)
	}
	const id = "2b4ab23d-4ad4-4a7f-9a3c-36b5f2b0c001"
	if err := m.Create(parent, ts.ID, id); err != nil {
		t.Fatal(err)
	}
	if err := m.Create(parent, ts.ID, "2b4ab23d-4ad4-4a7f-9a3c-36b5f2b0c002"); err == nil {
		t.Error("second vGPU on one VF")
	}
	if next, _ := m.Parent(h100, ts.ID); next != "0000:1b:00.5" {
		t.Errorf("next parent %q", next)
	}
	if group, err := m.IOMMUGroup(id); err != nil || group < 0 {
		t.Errorf("IOMMU group %d: %v", group, err)
	}
	if gi, err := b.VGPUInstanceOf(h100, id); err != nil || gi != -1 {
		t.Errorf("time-sliced vGPU on GI %d: %v", gi, err)
	}
	if err := m.Remove(id); err != nil || m.Exists(id) {
		t.Fatalf("remove: %v", err)
	}
	if err := m.Remove(id); err != nil {
		t.Errorf("second remove: %v", err)
	}
	if _, err := b.VGPUInstanceOf(h100, id); !errors.Is(err, ErrNotFound) {
		t.Errorf("removed vGPU: %v", err)
	}

	// MIG-backed: the GPU instance first, then the vGPU lands on it.
	if err := b.SetMIGMode(h100, true); err != nil {
		t.Fatal(err)
	}
	gi, err := b.CreateGPUInstance(h100, *mb.GPUInstanceProfileID, hw.Placement{Start: 3, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	parent, err = m.Parent(h100, mb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Create(parent, mb.ID, id); err != nil {
		t.Fatal(err)
	}
	if got, err := b.VGPUInstanceOf(h100, id); err != nil || got != gi {
		t.Errorf("MIG-backed vGPU on GI %d, want %d: %v", got, gi, err)
	}
	if err := b.DestroyGPUInstance(h100, gi); !errors.Is(err, nvml.ERROR_IN_USE) {
		t.Errorf("destroy a GI that hosts a vGPU: %v", err)
	}
	if err := m.Remove(id); err != nil {
		t.Fatal(err)
	}
	if err := b.DestroyGPUInstance(h100, gi); err != nil {
		t.Fatal(err)
	}
}

// A pre-Ampere GPU has its mdev types on its own function, with more than
// one instance available; the GPU's function is preferred to its VFs.
func TestMdevParentOnTheGPU(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "bus/pci/devices/0000:3b:00.0/mdev_supported_types/nvidia-63")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "available_instances"), []byte("4\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "create"), nil, 0o644)
	m := NewMdevs(root, nil)
	parent, err := m.Parent("0000:3b:00.0", 63)
	if err != nil || parent != "0000:3b:00.0" {
		t.Fatalf("parent %q: %v", parent, err)
	}
	if err := m.Create(parent, 63, "2b4ab23d-4ad4-4a7f-9a3c-36b5f2b0c001"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "create")); string(b) != "2b4ab23d-4ad4-4a7f-9a3c-36b5f2b0c001" {
		t.Errorf("create got %q", b)
	}
	if _, err := m.Parent("0000:3b:00.0", 64); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown type: %v", err)
	}
}
