// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// NVIDIA vGPUs are mediated devices (mdev) created through sysfs:
//
//	/sys/bus/pci/devices/<parent>/mdev_supported_types/nvidia-<type ID>/
//	    name                 "NVIDIA H100-10C"
//	    available_instances  how many more fit on this parent
//	    device_api           "vfio-pci"
//	    description, create, devices/
//	echo <uuid> > .../nvidia-<type ID>/create
//	/sys/bus/mdev/devices/<uuid> -> the device, with remove, mdev_type,
//	    iommu_group (its VFIO group: /dev/vfio/<group>)
//	echo 1 > /sys/bus/mdev/devices/<uuid>/remove
//
// Where the parent is depends on the GPU:
//   - before Ampere, the GPU's own PCI function is the parent, and a type's
//     available_instances counts down from its maximum;
//   - Ampere and later use SR-IOV: the GPU's virtual functions (enabled by
//     the vGPU manager's sriov-manage, linked as virtfn<i>) are the
//     parents, each hosting at most one vGPU (available_instances 0 or 1).
//     For a MIG-backed type the GPU instance must exist first; the driver
//     puts the vGPU on a free GPU instance of the type's profile.
//
// Parent looks in both places, the GPU's function first. R550+ drivers
// on Ada, Hopper and Blackwell with current kernels use the
// vendor-specific VFIO framework instead (vfvgpu.go); Framework tells
// which one a GPU's driver uses.

// SysfsWriter writes one sysfs attribute. Path is relative to the sysfs
// root. Sysfs attributes are never created by a write: a missing one is
// an error.
type SysfsWriter interface {
	WriteFile(path string, data []byte) error
}

// SysfsFiles is the host's SysfsWriter: plain writes under a sysfs root.
type SysfsFiles string

// WriteFile implements SysfsWriter.
func (root SysfsFiles) WriteFile(path string, data []byte) error {
	f, err := os.OpenFile(filepath.Join(string(root), path), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	return errors.Join(err, f.Close())
}

// sysfs reads attributes under a sysfs root and writes them, whose side
// effects are the kernel's or a driver's, through a SysfsWriter.
type sysfs struct {
	root string
	w    SysfsWriter
}

// newSysfs reads under root ("/sys" on a host) and writes through w (nil:
// SysfsFiles(root)).
func newSysfs(root string, w SysfsWriter) sysfs {
	if w == nil {
		w = SysfsFiles(root)
	}
	return sysfs{root: root, w: w}
}

// Mdevs creates and removes vGPU mediated devices.
type Mdevs struct{ sysfs }

// NewMdevs reads sysfs under root ("/sys" on a host) and writes through w
// (nil: SysfsFiles(root)).
func NewMdevs(root string, w SysfsWriter) *Mdevs { return &Mdevs{newSysfs(root, w)} }

// MdevTypeDir is the mdev type directory name of an NVIDIA vGPU type.
func MdevTypeDir(typeID uint) string { return "nvidia-" + strconv.FormatUint(uint64(typeID), 10) }

func (m *Mdevs) typePath(parent string, typeID uint) string {
	return filepath.Join("bus/pci/devices", parent, "mdev_supported_types", MdevTypeDir(typeID))
}

// Parent returns the PCI function that can host one more vGPU of a type
// on the GPU: the GPU's own function if it has room, else its first
// virtual function that has (in virtfn order).
func (m *Mdevs) Parent(gpuBusID string, typeID uint) (string, error) {
	candidates := []string{gpuBusID}
	vfs, err := virtfns(m.root, gpuBusID)
	if err != nil {
		return "", err
	}
	candidates = append(candidates, vfs...)
	seen := false
	for _, c := range candidates {
		raw, err := os.ReadFile(filepath.Join(m.root, m.typePath(c, typeID), "available_instances"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		seen = true
		if n, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil && n > 0 {
			return c, nil
		}
	}
	if !seen {
		return "", fmt.Errorf("GPU %s: no mdev type %s on the GPU or its %d virtual functions (vGPU manager not loaded, or SR-IOV not enabled with sriov-manage?): %w",
			gpuBusID, MdevTypeDir(typeID), len(vfs), ErrNotFound)
	}
	return "", fmt.Errorf("GPU %s: no room for another vGPU of type %s (available_instances is 0 on the GPU and its %d virtual functions)",
		gpuBusID, MdevTypeDir(typeID), len(vfs))
}

// virtfns lists a PF's virtual functions in virtfn order.
func virtfns(root, busID string) ([]string, error) {
	dir := filepath.Join(root, "bus/pci/devices", busID)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("GPU %s: %w", busID, err)
	}
	type vf struct {
		n    int
		addr string
	}
	var vfs []vf
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), "virtfn")
		n, err := strconv.Atoi(rest)
		if !ok || err != nil {
			continue
		}
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		vfs = append(vfs, vf{n, filepath.Base(target)})
	}
	sort.Slice(vfs, func(i, j int) bool { return vfs[i].n < vfs[j].n })
	out := make([]string, len(vfs))
	for i, v := range vfs {
		out[i] = v.addr
	}
	return out, nil
}

// Create creates the mediated device uuid of a vGPU type on a parent.
func (m *Mdevs) Create(parent string, typeID uint, uuid string) error {
	path := filepath.Join(m.typePath(parent, typeID), "create")
	if err := m.w.WriteFile(path, []byte(uuid)); err != nil {
		return fmt.Errorf("create vGPU mdev %s of type %s on %s: %w", uuid, MdevTypeDir(typeID), parent, err)
	}
	return nil
}

func (m *Mdevs) devicePath(uuid string) string { return filepath.Join("bus/mdev/devices", uuid) }

// Exists reports whether the mediated device exists.
func (m *Mdevs) Exists(uuid string) bool {
	_, err := os.Stat(filepath.Join(m.root, m.devicePath(uuid)))
	return err == nil
}

// Remove removes a mediated device; one that does not exist is no error.
func (m *Mdevs) Remove(uuid string) error {
	if !m.Exists(uuid) {
		return nil
	}
	if err := m.w.WriteFile(filepath.Join(m.devicePath(uuid), "remove"), []byte("1")); err != nil {
		if !m.Exists(uuid) {
			return nil // gone meanwhile
		}
		return fmt.Errorf("remove vGPU mdev %s: %w", uuid, err)
	}
	return nil
}

// IOMMUGroup is the mediated device's IOMMU group: its VFIO device node
// is /dev/vfio/<group>.
func (m *Mdevs) IOMMUGroup(uuid string) (int, error) {
	n, err := IOMMUGroup(m.root, m.devicePath(uuid))
	if err != nil {
		return 0, fmt.Errorf("vGPU mdev %s: %w", uuid, err)
	}
	return n, nil
}

// IOMMUGroup is the IOMMU group of the device at path (relative to the
// sysfs root): its VFIO group node is /dev/vfio/<group>.
func IOMMUGroup(root, path string) (int, error) {
	target, err := os.Readlink(filepath.Join(root, path, "iommu_group"))
	if err != nil {
		return 0, fmt.Errorf("IOMMU group: %w", err)
	}
	n, err := strconv.Atoi(filepath.Base(target))
	if err != nil {
		return 0, fmt.Errorf("IOMMU group %q: %w", target, err)
	}
	return n, nil
}
