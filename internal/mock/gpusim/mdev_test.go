// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/hwdra/hwdra/internal/mock/nodefs"
	"golang.org/x/sys/unix"
)

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestCapsAndDeviceNodes(t *testing.T) {
	h := build(t, "gpus: [{model: h100-80gb, count: 2, mig: true, migInstances: [{profile: 3g.40gb, start: 4}]}]")
	proc := h.proc
	if got := readTrim(t, filepath.Join(proc, "driver/nvidia/capabilities/gpu1/mig/gi0/access")); !strings.HasPrefix(got, "DeviceFileMinor: 138\n") {
		t.Errorf("gpu1/gi0 access: %q (minor 3 + 135)", got)
	}
	if got := readTrim(t, filepath.Join(proc, "driver/nvidia/capabilities/gpu1/mig/gi0/ci0/access")); !strings.HasPrefix(got, "DeviceFileMinor: 139\n") {
		t.Errorf("gpu1/gi0/ci0 access: %q", got)
	}
	minors := readTrim(t, filepath.Join(proc, "driver/nvidia-caps/mig-minors"))
	for _, line := range []string{"config 1", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4", "gpu1/gi14/ci7/access 272"} {
		if !strings.Contains(minors+"\n", line+"\n") {
			t.Errorf("mig-minors lacks %q", line)
		}
	}
	if devs := readTrim(t, filepath.Join(proc, "devices")); !strings.Contains(devs, "511 nvidia-caps\n") || !strings.Contains(devs, "510 nvidia-uvm\n") {
		t.Errorf("/proc/devices:\n%s", devs)
	}
	// Destroying the instance withdraws its capabilities.
	dev := device(t, h, 0)
	gis, _ := dev.GetGpuInstances(&[]nvml.GpuInstanceProfileInfo{giProfile(t, dev, "3g.40gb")}[0])
	cis, _ := gis[0].GetComputeInstances(&nvml.ComputeInstanceProfileInfo{Id: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE})
	cis[0].Destroy()
	gis[0].Destroy()
	if _, err := os.Stat(filepath.Join(proc, "driver/nvidia/capabilities/gpu0/mig/gi0")); !os.IsNotExist(err) {
		t.Errorf("capabilities of a destroyed GI: %v", err)
	}
	if !nodefs.CanMknod() {
		t.Skip("not root: the mock creates no device nodes")
	}
	for name, want := range map[string][2]uint32{
		"nvidiactl": {195, 255}, "nvidia1": {195, 1}, "nvidia-uvm": {510, 0}, "nvidia-uvm-tools": {510, 1},
		"nvidia-caps/nvidia-cap138": {511, 138},
	} {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(h.dev, name), &st); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != want[0] || unix.Minor(st.Rdev) != want[1] {
			t.Errorf("%s: mode %o %d:%d, want char %d:%d", name, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), want[0], want[1])
		}
	}
}

func TestMdevKernel(t *testing.T) {
	h := build(t, "gpus: [{model: h100-80gb, count: 1, virtualization: host-vgpu}]")
	w := h.SysfsWriter()
	vf := "bus/pci/devices/0000:1b:00.4"
	types := filepath.Join(h.sysfs, vf, "mdev_supported_types")
	entries, _ := os.ReadDir(types)
	byName := map[string]string{}
	for _, e := range entries {
		byName[readTrim(t, filepath.Join(types, e.Name(), "name"))] = e.Name()
	}
	ts, mb := byName["NVIDIA H100-10C"], byName["NVIDIA H100-1-10C"]
	if ts == "" || mb == "" {
		t.Fatalf("types %v", byName)
	}
	avail := func(typ string) string { return readTrim(t, filepath.Join(types, typ, "available_instances")) }
	if avail(ts) != "1" || avail(mb) != "0" {
		t.Fatalf("available: time-sliced %s, MIG-backed %s (MIG off)", avail(ts), avail(mb))
	}
	if readTrim(t, filepath.Join(h.sysfs, "bus/pci/devices/0000:1b:00.0/sriov_numvfs")) != "20" {
		t.Error("sriov_numvfs")
	}
	create := filepath.Join(vf, "mdev_supported_types", ts, "create")
	const id = "0b8f1a52-7b7e-4bc2-a0b5-cc1f8b3a0001"
	for _, c := range []struct {
		path, data string
		want       error
	}{
		{create, "not-a-uuid", syscall.EINVAL},
		{create, id, nil},
		{filepath.Join("bus/pci/devices/0000:1b:00.5/mdev_supported_types", ts, "create"), id, syscall.EEXIST},
		{filepath.Join(vf, "mdev_supported_types", mb, "create"), "0b8f1a52-7b7e-4bc2-a0b5-cc1f8b3a0002", syscall.EUSERS},
		{"bus/mdev/devices/" + id + "/remove", "0", syscall.EINVAL},
		{"bus/pci/devices/0000:1b:00.4/nonexistent", "1", syscall.ENOENT},
	} {
		if err := w.WriteFile(c.path, []byte(c.data)); !errors.Is(err, c.want) && (c.want != nil || err != nil) {
			t.Errorf("write %q to %s: %v, want %v", c.data, c.path, err, c.want)
		}
	}
	if avail(ts) != "0" {
		t.Error("a VF hosting a vGPU still offers one")
	}
	if got := h.MdevUUIDs(); len(got) != 1 || got[0] != id {
		t.Fatalf("mdevs %v", got)
	}
	link, _ := os.Readlink(filepath.Join(h.sysfs, "bus/mdev/devices", id, "mdev_type"))
	if filepath.Base(link) != ts {
		t.Errorf("mdev_type -> %s", link)
	}
	vgpus, ret := device(t, h, 0).GetActiveVgpus()
	if ret != nvml.SUCCESS || len(vgpus) != 1 {
		t.Fatalf("active vGPUs: %d %v", len(vgpus), ret)
	}
	if got, _ := vgpus[0].GetMdevUUID(); got != id {
		t.Errorf("vGPU mdev %s", got)
	}
	if err := w.WriteFile("bus/mdev/devices/"+id+"/remove", []byte("1\n")); err != nil {
		t.Fatal(err)
	}
	if len(h.MdevUUIDs()) != 0 || avail(ts) != "1" {
		t.Errorf("after remove: mdevs %v, available %s", h.MdevUUIDs(), avail(ts))
	}
	if _, err := os.Stat(filepath.Join(h.sysfs, vf, id)); !os.IsNotExist(err) {
		t.Errorf("mdev directory left: %v", err)
	}
	// MIG on: time-sliced types go, MIG-backed ones come with a free GPU instance.
	dev := device(t, h, 0)
	dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	if avail(ts) != "0" || avail(mb) != "0" {
		t.Errorf("MIG on, no instance: %s %s", avail(ts), avail(mb))
	}
	g1 := giProfile(t, dev, "1g.10gb")
	if _, ret := dev.CreateGpuInstanceWithPlacement(&g1, at(6, 1)); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if avail(mb) != "1" {
		t.Errorf("MIG-backed type with a free 1g instance: %s", avail(mb))
	}
}
