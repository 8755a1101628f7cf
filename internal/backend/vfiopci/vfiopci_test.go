// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package vfiopci

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
)

// TestGPUs: on a mock node with GPUs of every kind, exactly the ones bound
// to vfio-pci are found, with their place on the node and a name.
func TestGPUs(t *testing.T) {
	h := mocktest.Open(t, `gpus:
- {model: h100-80gb, count: 1}
- {model: h100-80gb, count: 2, virtualization: passthrough, numaNodes: [1, 1]}
- {model: h100-80gb, count: 1, virtualization: host-vgpu, vgpuFramework: vfio}
nics: [{model: cx7, count: 1, vfs: 2, vfDriver: vfio-pci}]`)
	s, err := New(h.Sysfs)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("found %+v, want the two vfio-pci GPUs", got)
	}
	name := "NVIDIA device 2330"
	if _, err := os.Stat("/usr/share/misc/pci.ids"); err == nil {
		name = "GH100[H100 SXM5 80GB]" // Debian's pci.ids (2023.04)
	}
	for i, g := range got {
		want := hw.PassthroughGPU{PCIBusID: []string{"0000:43:00.0", "0000:52:00.0"}[i], VendorID: "10de", DeviceID: "2330",
			ProductName: name, NUMANode: 1, PCIeRoot: g.PCIeRoot, IOMMUGroup: g.IOMMUGroup}
		if g != want || !strings.HasPrefix(g.PCIeRoot, "pci0000:") {
			t.Errorf("GPU %d: %+v, want %+v", i, g, want)
		}
		if err := GroupViable(h.Sysfs, g.IOMMUGroup); err != nil {
			t.Error(err)
		}
	}
	if _, err := New(filepath.Join(h.Sysfs, "bus")); err == nil {
		t.Error("a sysfs root not named sys accepted")
	}
}

// TestGroupViable: a group with a device on another driver cannot be
// opened, and the error names it.
func TestGroupViable(t *testing.T) {
	h := mocktest.Open(t, `gpus: [{model: h100-80gb, count: 1, virtualization: passthrough}]`)
	s, _ := New(h.Sysfs)
	gpus, err := s.GPUs()
	if err != nil || len(gpus) != 1 {
		t.Fatal(gpus, err)
	}
	g := gpus[0]
	// The GPU's audio function, left on its sound driver, in the group.
	audio := filepath.Join(h.Sysfs, "devices/audio-0000:1b:00.1")
	drv := filepath.Join(h.Sysfs, "bus/pci/drivers/snd_hda_intel")
	for _, d := range []string{audio, drv} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Symlink(drv, filepath.Join(audio, "driver"))
	os.Symlink(audio, filepath.Join(h.Sysfs, "kernel/iommu_groups", itoa(g.IOMMUGroup), "devices", "0000:1b:00.1"))
	err = GroupViable(h.Sysfs, g.IOMMUGroup)
	if err == nil || !strings.Contains(err.Error(), "0000:1b:00.1 (snd_hda_intel)") {
		t.Fatalf("GroupViable: %v", err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestNoIOMMUGroups: on a kernel that runs VFIO without an IOMMU, a
// device's VFIO group is noiommu-<group>, said so and refused unless
// allowed; NoIOMMUGroups lists such groups with their devices. With an
// IOMMU the same device's group is its number and never refused.
func TestNoIOMMUGroups(t *testing.T) {
	const node = "gpus: [{model: h100-80gb, count: 1}, {model: h100-80gb, count: 1, virtualization: passthrough}]"
	for _, noIOMMU := range []bool{false, true} {
		profile := node
		if noIOMMU {
			profile = "noIOMMU: true\n" + node
		}
		h := mocktest.Open(t, profile)
		s, err := New(h.Sysfs)
		if err != nil {
			t.Fatal(err)
		}
		gpus, err := s.GPUs()
		if err != nil || len(gpus) != 1 {
			t.Fatalf("%+v %v", gpus, err)
		}
		g, err := VFIOGroup(h.Sysfs, gpus[0].IOMMUGroup)
		if err != nil {
			t.Fatal(err)
		}
		num := strconv.Itoa(gpus[0].IOMMUGroup)
		want := Group{Number: gpus[0].IOMMUGroup, Node: num, Major: g.Major, Minor: g.Minor}
		if noIOMMU {
			want.Node, want.NoIOMMU = "noiommu-"+num, true
		}
		if g != want || g.Major == 0 {
			t.Errorf("noIOMMU %t: %+v, want %+v", noIOMMU, g, want)
		}
		refused := RefuseNoIOMMU("GPU "+gpus[0].PCIBusID, g, false)
		if (refused != nil) != noIOMMU || noIOMMU && !strings.Contains(refused.Error(), "GPU 0000:43:00.0 is in VFIO group noiommu-"+num) {
			t.Errorf("noIOMMU %t: refusal %v", noIOMMU, refused)
		}
		if err := RefuseNoIOMMU("GPU", g, true); err != nil {
			t.Errorf("refused though allowed: %v", err)
		}
		groups, err := NoIOMMUGroups(h.Sysfs)
		if err != nil {
			t.Fatal(err)
		}
		if noIOMMU != (len(groups) == 1) || noIOMMU && strings.Join(groups[gpus[0].IOMMUGroup], ",") != gpus[0].PCIBusID {
			t.Errorf("noIOMMU %t: groups %v", noIOMMU, groups)
		}
	}
	if _, err := VFIOGroup(t.TempDir(), 7); err == nil || !strings.Contains(err.Error(), "IOMMU group 7 has no VFIO group device") {
		t.Errorf("a group without a device: %v", err)
	}
}
