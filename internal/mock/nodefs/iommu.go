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
// class/vfio/<group>/dev and, as root, /dev/vfio/<group>.
func (d *Dev) VFIOGroup(sysfs string, group int, minor uint32) error {
	dir := filepath.Join(sysfs, "class", "vfio", strconv.Itoa(group))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "dev"), []byte(fmt.Sprintf("%d:%d\n", VFIOMajor, minor)), 0o644); err != nil {
		return err
	}
	return d.Node("vfio/"+strconv.Itoa(group), VFIOMajor, minor)
}
