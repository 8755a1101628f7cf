// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hwdra/hwdra/internal/hw"
)

// TestVGPUFramework: each host-vGPU GPU reports the framework its driver
// uses, with the VFs that host vGPUs, and which of NVML's types it can
// create; a GPU whose mdev types lack one cannot create it.
func TestVGPUFramework(t *testing.T) {
	for _, tc := range []struct {
		profile string
		want    hw.VGPUFramework
	}{
		{"h100-vgpu", hw.VGPUFrameworkMdev},
		{"h100-vm", hw.VGPUFrameworkVFIO},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			gpus, h := inventory(t, tc.profile)
			if len(gpus) != 2 {
				t.Fatalf("%d GPUs (those bound to vfio-pci are not NVML's)", len(gpus))
			}
			for _, g := range gpus {
				v := g.VGPU
				if v.Framework != tc.want || v.VFs != 20 || len(v.Types) == 0 {
					t.Errorf("GPU %s: framework %q, %d VFs, %d types", g.PCIBusID, v.Framework, v.VFs, len(v.Types))
				}
				for _, typ := range v.Types {
					if !typ.Creatable {
						t.Errorf("GPU %s: type %s not creatable", g.PCIBusID, typ.Name)
					}
				}
			}
			if tc.want != hw.VGPUFrameworkMdev {
				return
			}
			// A type the vGPU manager supports but offers no mdev type for.
			g := gpus[0]
			drop := g.VGPU.Types[0]
			vfs, _ := virtfns(h.Sysfs, g.PCIBusID)
			for _, vf := range vfs {
				os.RemoveAll(filepath.Join(h.Sysfs, "bus/pci/devices", vf, "mdev_supported_types", MdevTypeDir(drop.ID)))
			}
			fw, n, types, err := Framework(h.Sysfs, g.PCIBusID)
			if err != nil || fw != hw.VGPUFrameworkMdev || n != 20 || types[drop.ID] || len(types) != len(g.VGPU.Types)-1 {
				t.Errorf("after dropping %s: %q %d %v %v", drop.Name, fw, n, types, err)
			}
		})
	}
}
