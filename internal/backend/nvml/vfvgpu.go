// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
)

// NVIDIA's vendor-specific VFIO framework (vGPU 17, the R550 driver, and
// later, on Ada, Hopper and Blackwell GPUs with current kernels; NVIDIA
// vGPU software user guide, "Creating an NVIDIA vGPU on a Linux with KVM
// Hypervisor that uses a vendor-specific VFIO framework", and NVIDIA AI
// Enterprise's "vGPU for Compute" pages): the vGPU manager's
// sriov-manage enables the GPU's SR-IOV virtual functions, bound to its
// VFIO variant driver, and each VF has
//
//	/sys/bus/pci/devices/<vf>/nvidia/creatable_vgpu_types
//	    the types this VF can become now, one "<type ID> : <name>" per
//	    line after a header line; the list follows what runs on the GPU
//	    (one time-sliced size at a time without heterogeneous mode, a
//	    MIG-backed type only while a free GPU instance of its profile
//	    exists, nothing while the VF is a vGPU itself)
//	/sys/bus/pci/devices/<vf>/nvidia/current_vgpu_type
//	    0, or the ID of the vGPU type the VF is; writing a type ID makes
//	    it one, writing 0 makes it none again
//
// A VM launcher then opens the VF like any VFIO PCI device, through its
// IOMMU group (/dev/vfio/<group>). There is no mdev and no UUID: the VF's
// PCI address names the vGPU. As with mdev, the driver and not the
// caller picks the GPU instance of a MIG-backed type (one of the type's
// profile that hosts no vGPU); the instance must exist first.

// creatableFile and currentFile are a VF's files of the framework.
const (
	creatableFile = "nvidia/creatable_vgpu_types"
	currentFile   = "nvidia/current_vgpu_type"
)

var (
	// ErrNoFreeVF is wrapped when every VF of a GPU is a vGPU already.
	ErrNoFreeVF = errors.New("no free VF")
	// ErrNotCreatable is wrapped when free VFs exist but none can become
	// a vGPU of the type now.
	ErrNotCreatable = errors.New("vGPU type not creatable")
)

// Framework finds how the driver creates vGPUs on a GPU in host-vGPU mode,
// from sysfs under root: mdev types on the GPU's own function (before
// Ampere) or its VFs, or the VFs' nvidia/ directory (the vendor-specific
// VFIO framework). It returns the VFs that host vGPUs (0 where the GPU's
// own function does) and the mdev type IDs offered (nil for the VFIO
// framework, which creates every type the vGPU manager supports). An
// empty framework: neither is set up (no VFs enabled, vGPU manager not
// loaded), and no vGPU can be created.
func Framework(root, gpuBusID string) (hw.VGPUFramework, int, map[uint]bool, error) {
	if types, ok := mdevTypes(root, gpuBusID); ok {
		return hw.VGPUFrameworkMdev, 0, types, nil
	}
	vfs, err := virtfns(root, gpuBusID)
	if err != nil || len(vfs) == 0 {
		return "", 0, nil, err
	}
	if types, ok := mdevTypes(root, vfs[0]); ok {
		return hw.VGPUFrameworkMdev, len(vfs), types, nil
	}
	if _, err := os.Stat(filepath.Join(root, "bus/pci/devices", vfs[0], creatableFile)); err == nil {
		return hw.VGPUFrameworkVFIO, len(vfs), nil, nil
	}
	return "", 0, nil, nil
}

// mdevTypes lists the vGPU types of a PCI function's mdev_supported_types;
// ok is false where it has none.
func mdevTypes(root, fn string) (map[uint]bool, bool) {
	entries, err := os.ReadDir(filepath.Join(root, "bus/pci/devices", fn, "mdev_supported_types"))
	if err != nil {
		return nil, false
	}
	out := map[uint]bool{}
	for _, e := range entries {
		if id, err := strconv.ParseUint(strings.TrimPrefix(e.Name(), "nvidia-"), 10, 32); err == nil && strings.HasPrefix(e.Name(), "nvidia-") {
			out[uint(id)] = true
		}
	}
	return out, true
}

// VFVGPUs makes VFs vGPUs through the vendor-specific VFIO framework.
type VFVGPUs struct{ sysfs }

// NewVFVGPUs reads sysfs under root ("/sys" on a host) and writes through
// w (nil: SysfsFiles(root)).
func NewVFVGPUs(root string, w SysfsWriter) *VFVGPUs { return &VFVGPUs{newSysfs(root, w)} }

func (v *VFVGPUs) path(vf, file string) string { return filepath.Join("bus/pci/devices", vf, file) }

// Free returns the first VF of the GPU (in virtfn order) that is no vGPU
// and lists the type as creatable. The error wraps ErrNoFreeVF when every
// VF is a vGPU, ErrNotCreatable when none of the free ones can become
// one of this type now (and says what they offer).
func (v *VFVGPUs) Free(gpuBusID string, typeID uint) (string, error) {
	vfs, err := virtfns(v.root, gpuBusID)
	if err != nil {
		return "", err
	}
	free := 0
	offered := map[uint]string{}
	for _, vf := range vfs {
		cur, err := v.Current(vf)
		if err != nil {
			return "", err
		}
		if cur != 0 {
			continue
		}
		free++
		types, err := v.creatable(vf)
		if err != nil {
			return "", err
		}
		if _, ok := types[typeID]; ok {
			return vf, nil
		}
		for id, name := range types {
			offered[id] = name
		}
	}
	if free == 0 {
		return "", fmt.Errorf("GPU %s: all %d VFs are vGPUs: %w", gpuBusID, len(vfs), ErrNoFreeVF)
	}
	var names []string
	for _, name := range offered {
		names = append(names, name)
	}
	what := "none"
	if len(names) > 0 {
		slices.Sort(names)
		what = strings.Join(names, ", ")
	}
	return "", fmt.Errorf("GPU %s: none of its %d free VFs can become vGPU type %d now (they offer: %s; another type may run where types cannot mix, or the GPU instance is missing): %w",
		gpuBusID, free, typeID, what, ErrNotCreatable)
}

// Current is the vGPU type a VF is, 0 for none.
func (v *VFVGPUs) Current(vf string) (uint, error) {
	raw, err := os.ReadFile(filepath.Join(v.root, v.path(vf, currentFile)))
	if err != nil {
		return 0, fmt.Errorf("VF %s: %w", vf, err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("VF %s: %s %q: %w", vf, currentFile, raw, err)
	}
	return uint(n), nil
}

// creatable parses a VF's creatable_vgpu_types: type ID -> name.
func (v *VFVGPUs) creatable(vf string) (map[uint]string, error) {
	f, err := os.Open(filepath.Join(v.root, v.path(vf, creatableFile)))
	if err != nil {
		return nil, fmt.Errorf("VF %s: %w", vf, err)
	}
	defer f.Close()
	out := map[uint]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		id, name, ok := strings.Cut(sc.Text(), ":")
		n, err := strconv.ParseUint(strings.TrimSpace(id), 10, 32)
		if !ok || err != nil {
			continue // the header, "ID : vGPU Name"
		}
		out[uint(n)] = strings.TrimSpace(name)
	}
	return out, sc.Err()
}

// Assign makes a VF a vGPU of a type. The driver refuses (the error says
// why) a type the VF does not list as creatable and a VF that is a vGPU.
func (v *VFVGPUs) Assign(vf string, typeID uint) error {
	if err := v.w.WriteFile(v.path(vf, currentFile), []byte(strconv.FormatUint(uint64(typeID), 10))); err != nil {
		return fmt.Errorf("make VF %s a vGPU of type %d: the driver refused: %w", vf, typeID, err)
	}
	return nil
}

// Clear makes a VF no vGPU: a VF that is none is left alone.
func (v *VFVGPUs) Clear(vf string) error {
	cur, err := v.Current(vf)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // the VF is gone (SR-IOV disabled): so is its vGPU
	}
	if err != nil || cur == 0 {
		return err
	}
	if err := v.w.WriteFile(v.path(vf, currentFile), []byte("0")); err != nil {
		return fmt.Errorf("VF %s: clear vGPU type %d: %w", vf, cur, err)
	}
	return nil
}

// IOMMUGroup is a VF's IOMMU group: /dev/vfio/<group>.
func (v *VFVGPUs) IOMMUGroup(vf string) (int, error) {
	n, err := IOMMUGroup(v.root, filepath.Join("bus/pci/devices", vf))
	if err != nil {
		return 0, fmt.Errorf("VF %s: %w", vf, err)
	}
	return n, nil
}

// GPUInstancesWithVGPUs lists the GPU instances that host a vGPU now.
// The VFIO framework names no GPU instance at creation (the driver picks
// one of the type's profile) and its vGPUs have no mdev UUID to look
// them up by: prepare compares this before and after a VF becomes a
// MIG-backed vGPU, under the GPU's lock.
func (b *Backend) GPUInstancesWithVGPUs(busID string) (map[int]bool, error) {
	out := map[int]bool{}
	err := b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		if !b.has("nvmlVgpuInstanceGetGpuInstanceId") {
			return nil // a driver without MIG-backed vGPU
		}
		vgpus, ret := dev.GetActiveVgpus()
		if ret != nvml.SUCCESS {
			return ref.err("GetActiveVgpus", ret)
		}
		for _, v := range vgpus {
			g, ret := v.GetGpuInstanceId()
			if ret != nvml.SUCCESS {
				return ref.err("vGPU: GetGpuInstanceId", ret)
			}
			if uint32(g) != invalidGIID && g >= 0 {
				out[g] = true
			}
		}
		return nil
	})
	return out, err
}
