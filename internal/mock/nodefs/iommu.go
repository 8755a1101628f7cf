// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nodefs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// LinkIOMMUGroup puts a device (its sysfs directory, absolute, and the
// name it has in the group: a PCI address or an mdev UUID) in an IOMMU
// group, as the kernel links them: <dev>/iommu_group and
// kernel/iommu_groups/<group>/devices/<name>.
func LinkIOMMUGroup(sysfs, devDir, name string, group int) error {
	groupDir := filepath.Join(sysfs, "kernel", "iommu_groups", strconv.Itoa(group))
	if err := os.MkdirAll(filepath.Join(groupDir, "devices"), 0o755); err != nil {
		return err
	}
	for _, l := range []struct{ at, to string }{
		{filepath.Join(devDir, "iommu_group"), groupDir},
		{filepath.Join(groupDir, "devices", name), devDir},
	} {
		rel, err := filepath.Rel(filepath.Dir(l.at), l.to)
		if err != nil {
			return err
		}
		if err := os.Symlink(rel, l.at); err != nil {
			return err
		}
	}
	return nil
}

// VFIOGroup publishes an IOMMU group's VFIO group device, as the kernel
// does once a VFIO driver holds the group's devices:
// class/vfio/<group>/dev and, as root, /dev/vfio/<group>. A kernel that
// runs VFIO without an IOMMU (Dev.NoIOMMU) names the group of a PCI
// function noiommu-<group>, and the IOMMU group vfio-noiommu; a mediated
// device's group (mdev) is the kernel's own either way.
func (d *Dev) VFIOGroup(sysfs string, group int, minor uint32, mdev bool) error {
	name := strconv.Itoa(group)
	if d.NoIOMMU && !mdev {
		name = "noiommu-" + name
		if err := os.WriteFile(filepath.Join(sysfs, "kernel", "iommu_groups", strconv.Itoa(group), "name"), []byte("vfio-noiommu\n"), 0o644); err != nil {
			return err
		}
	}
	dir := filepath.Join(sysfs, "class", "vfio", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "dev"), []byte(fmt.Sprintf("%d:%d\n", VFIOMajor, minor)), 0o644); err != nil {
		return err
	}
	return d.Node("vfio/"+name, VFIOMajor, minor)
}

// NoIOMMUMode writes the vfio module's enable_unsafe_noiommu_mode, Y where
// the kernel runs VFIO without an IOMMU.
func (d *Dev) NoIOMMUMode(sysfs string) error {
	dir := filepath.Join(sysfs, "module", "vfio", "parameters")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	v := "N\n"
	if d.NoIOMMU {
		v = "Y\n"
	}
	return os.WriteFile(filepath.Join(dir, "enable_unsafe_noiommu_mode"), []byte(v), 0o644)
}
