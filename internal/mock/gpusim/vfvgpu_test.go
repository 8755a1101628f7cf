// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/mock/persist"
)

// TestVFIOFrameworkVFs: the VFs' nvidia/ files answer as the driver does:
// a type not creatable is refused, so is a write while the VF is a vGPU;
// without heterogeneous mode the other VFs offer only the running size
// once one runs, and a type at its maximum is offered no more; 0 undoes.
// NVML lists the VF's vGPU, with no mdev UUID. The state survives a
// snapshot and restore.
func TestVFIOFrameworkVFs(t *testing.T) {
	const spec = `gpus: [{model: h100-80gb, count: 1, virtualization: host-vgpu, vgpuFramework: vfio,
  vgpuTypes: [{name: NVIDIA H100-40C, framebufferMB: 40960, maxInstances: 2}, {name: NVIDIA H100-20C, framebufferMB: 20480, maxInstances: 4}]}]`
	h := build(t, spec)
	w := h.SysfsWriter()
	vf := func(i int) string { return fmt.Sprintf("0000:1b:00.%d", 4+i) }
	creatable := func(i int) string {
		return readTrim(t, filepath.Join(h.sysfs, "bus/pci/devices", vf(i), "nvidia/creatable_vgpu_types"))
	}
	set := func(i int, v string) error {
		return w.WriteFile(filepath.Join("bus/pci/devices", vf(i), "nvidia/current_vgpu_type"), []byte(v))
	}
	if got := creatable(0); got != "ID    : vGPU Name\n800   : NVIDIA H100-40C\n801   : NVIDIA H100-20C" {
		t.Fatalf("creatable at start:\n%s", got)
	}
	if _, err := filepath.EvalSymlinks(filepath.Join(h.sysfs, "bus/pci/devices", vf(0), "mdev_supported_types")); err == nil {
		t.Error("a VF of the VFIO framework has mdev types")
	}
	for _, bad := range []struct {
		value string
		errno syscall.Errno
	}{{"x", syscall.EINVAL}, {"999", syscall.EINVAL}} {
		if err := set(0, bad.value); !errors.Is(err, bad.errno) {
			t.Errorf("write %q: %v, want %v", bad.value, err, bad.errno)
		}
	}
	if err := set(0, "800"); err != nil {
		t.Fatal(err)
	}
	if got := readTrim(t, filepath.Join(h.sysfs, "bus/pci/devices", vf(0), "nvidia/current_vgpu_type")); got != "800" {
		t.Errorf("current_vgpu_type %q", got)
	}
	if err := set(0, "801"); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("a second type on a vGPU VF: %v", err)
	}
	if got := creatable(0); got != "ID    : vGPU Name" {
		t.Errorf("a vGPU VF still offers:\n%s", got)
	}
	if got := creatable(1); got != "ID    : vGPU Name\n800   : NVIDIA H100-40C" {
		t.Errorf("beside a 40C (no heterogeneous mode) VF 1 offers:\n%s", got)
	}
	if err := set(1, "801"); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("a 20C beside a 40C: %v", err)
	}
	if err := set(1, "800"); err != nil {
		t.Fatal(err)
	}
	if got := creatable(2); got != "ID    : vGPU Name" {
		t.Errorf("with two 40C (its maximum) VF 2 offers:\n%s", got)
	}
	vgpus, _ := device(t, h, 0).GetActiveVgpus()
	if len(vgpus) != 2 {
		t.Fatalf("NVML lists %d vGPUs", len(vgpus))
	}
	if _, ret := vgpus[0].GetMdevUUID(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("a VF's vGPU has an mdev UUID: %v", ret)
	}
	var s persist.State
	h.Snapshot(&s)
	if len(s.VFVGPUs) != 2 || s.VFVGPUs[0].VF != vf(0) || s.VFVGPUs[0].Type != "NVIDIA H100-40C" {
		t.Errorf("snapshot %+v", s.VFVGPUs)
	}
	again := build(t, spec)
	if err := again.Restore(s); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(again.VGPUVFs(), " "); got != vf(0)+"=800 "+vf(1)+"=800" {
		t.Errorf("restored %s", got)
	}
	for i := 0; i < 2; i++ {
		if err := set(i, "0"); err != nil {
			t.Fatal(err)
		}
	}
	if err := set(0, "0"); err != nil {
		t.Errorf("0 on a VF that is no vGPU: %v", err)
	}
	if got := creatable(2); !strings.Contains(got, "801   : NVIDIA H100-20C") {
		t.Errorf("all VFs free again, VF 2 offers:\n%s", got)
	}
}

// TestPassthroughGPUsOutsideNVML: GPUs bound to vfio-pci are on the bus,
// in IOMMU groups of their own, and NVML does not see them; a node of
// only such GPUs has no NVIDIA driver.
func TestPassthroughGPUsOutsideNVML(t *testing.T) {
	h := build(t, "gpus: [{model: h100-80gb, count: 1}, {model: h100-80gb, count: 1, virtualization: passthrough}]")
	if n, _ := h.NVML.DeviceGetCount(); n != 1 || len(h.BusIDs()) != 2 {
		t.Errorf("NVML sees %d GPUs of %v", n, h.BusIDs())
	}
	drv, err := filepath.EvalSymlinks(filepath.Join(h.sysfs, "bus/pci/devices/0000:43:00.0/driver"))
	if err != nil || filepath.Base(drv) != "vfio-pci" {
		t.Errorf("driver %s, %v", drv, err)
	}
	if g := readTrim(t, filepath.Join(h.sysfs, "class/vfio/384/dev")); g != "509:256" {
		t.Errorf("VFIO group 384: %q", g)
	}
	only := build(t, "gpus: [{model: h100-80gb, count: 1, virtualization: passthrough}]")
	if ret := only.NVML.Init(); ret != nvml.ERROR_LIBRARY_NOT_FOUND {
		t.Errorf("NVML on a node of vfio-pci GPUs only: %v", ret)
	}
}
