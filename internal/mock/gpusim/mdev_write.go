// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/uuid"

	"github.com/hwdra/hwdra/internal/mock/nodefs"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

// SysfsWriter writes attributes of the mock node's sysfs the way the
// kernel answers such writes: creating and removing mediated devices
// through mdev_supported_types/<type>/create and <mdev>/remove, with the
// errors the mdev core returns, and setting a VF's vGPU type through its
// nvidia/current_vgpu_type (vfvgpu.go). Other attributes are written as
// they are.
// It replaces only the kernel: callers write the same paths as on a host.
type SysfsWriter struct {
	sysfs string
	k     *mdevKernel
}

// SysfsWriter returns the writer for this node's sysfs tree.
func (g *GPUs) SysfsWriter() *SysfsWriter { return &SysfsWriter{sysfs: g.sysfs, k: g.kernel} }

// WriteFile writes data to a sysfs attribute; path is relative to the
// sysfs root and may pass through symlinks (bus/mdev/devices/<uuid>).
// Like sysfs, it never creates a file.
func (w *SysfsWriter) WriteFile(path string, data []byte) error {
	full := filepath.Join(w.sysfs, path)
	real, err := filepath.EvalSymlinks(full)
	if err != nil {
		return &fs.PathError{Op: "open", Path: full, Err: syscall.ENOENT}
	}
	dir := filepath.Dir(real)
	switch {
	case w.k != nil && filepath.Base(real) == "create" && filepath.Base(filepath.Dir(dir)) == "mdev_supported_types":
		err := w.k.create(full, dir, data)
		w.k.rep.Changed(persist.CallCreateMdev, w.k.gpuOf(filepath.Base(filepath.Dir(filepath.Dir(dir)))), err == nil)
		return err
	case w.k != nil && filepath.Base(real) == "current_vgpu_type" && filepath.Base(dir) == "nvidia":
		vf := filepath.Base(filepath.Dir(dir))
		err := w.k.setType(full, vf, data)
		w.k.rep.Changed(persist.CallSetVGPUType, w.k.gpuOf(vf), err == nil)
		return err
	case w.k != nil && filepath.Base(real) == "remove" && exists(filepath.Join(dir, "mdev_type")):
		err := w.k.remove(full, dir, data)
		w.k.rep.Changed(persist.CallRemoveMdev, w.k.gpuOf(filepath.Base(filepath.Dir(dir))), err == nil)
		return err
	}
	f, err := os.OpenFile(real, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	return errors.Join(err, f.Close())
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// create is a write to <parent>/mdev_supported_types/<type>/create:
//   - not a UUID: EINVAL;
//   - an mdev with that UUID exists: EEXIST;
//   - the type has no available instance (the VF hosts a vGPU already, the
//     GPU's MIG mode is wrong for the type, no free GPU instance of a
//     MIG-backed type's profile, ...): EUSERS, as the mdev core answers
//     since Linux 6.1.
//
// A MIG-backed vGPU lands on the lowest-ID GPU instance of its profile
// that hosts none: the vendor driver, not the caller, picks it.
func (k *mdevKernel) create(path, typeDir string, data []byte) error {
	id, err := uuid.Parse(strings.TrimSpace(string(data)))
	if err != nil || len(strings.TrimSpace(string(data))) != 36 {
		return &fs.PathError{Op: "write", Path: path, Err: syscall.EINVAL}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.parents[filepath.Base(filepath.Dir(filepath.Dir(typeDir)))]
	if p == nil || p.vfio {
		return &fs.PathError{Op: "write", Path: path, Err: syscall.ENODEV}
	}
	if exists(filepath.Join(k.sysfs, "bus/mdev/devices", id.String())) {
		return &fs.PathError{Op: "write", Path: path, Err: syscall.EEXIST}
	}
	d := p.gpu
	var typ nvml.VgpuTypeId
	for _, t := range d.vgpus {
		if typeDirName(t.GetID()) == filepath.Base(typeDir) {
			typ = t
		}
	}
	if typ == nil || p.hosted != nil || !k.available(d, typ) {
		return &fs.PathError{Op: "write", Path: path, Err: syscall.EUSERS}
	}
	v := &vgpuInstance{uuid: id.String(), typeID: typ.GetID(), gi: -1, parent: p, group: firstIOMMUGroup}
	for k.groups[v.group] {
		v.group++
	}
	if giProfile, _ := typ.GetGpuInstanceProfileId(); giProfile != invalidGIProfileID {
		d.RLock()
		v.gi = d.freeGILocked(giProfile)
		d.RUnlock()
	}
	if err := k.publish(v, typeDir); err != nil {
		k.unpublish(v)
		return &fs.PathError{Op: "write", Path: path, Err: fmt.Errorf("mock kernel: %w", err)}
	}
	k.groups[v.group] = true
	p.hosted = v
	d.Lock()
	d.active = append(d.active, v)
	d.Unlock()
	k.refreshLocked(d)
	return nil
}

// publish creates the mdev's sysfs entries, its IOMMU group and its VFIO
// group node (/dev/vfio/<group>).
func (k *mdevKernel) publish(v *vgpuInstance, typeDir string) error {
	dir := filepath.Join(v.parent.dir, v.uuid)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "remove"), ""); err != nil {
		return err
	}
	if err := nodefs.LinkIOMMUGroup(k.sysfs, dir, v.uuid, v.group); err != nil {
		return err
	}
	rel := func(from, to string) string { r, _ := filepath.Rel(filepath.Dir(from), to); return r }
	for _, l := range []struct{ at, to string }{
		{filepath.Join(dir, "mdev_type"), typeDir},
		{filepath.Join(typeDir, "devices", v.uuid), dir},
		{filepath.Join(k.sysfs, "bus/mdev/devices", v.uuid), dir},
	} {
		if err := os.Symlink(rel(l.at, l.to), l.at); err != nil {
			return err
		}
	}
	return k.tree.dev.VFIOGroup(k.sysfs, v.group, groupMinor(v.group), true)
}

// unpublish removes what publish created.
func (k *mdevKernel) unpublish(v *vgpuInstance) {
	for _, p := range []string{
		filepath.Join(k.sysfs, "bus/mdev/devices", v.uuid),
		filepath.Join(v.parent.dir, "mdev_supported_types", typeDirName(v.typeID), "devices", v.uuid),
		filepath.Join(k.sysfs, "kernel/iommu_groups", fmt.Sprint(v.group)),
		filepath.Join(k.sysfs, "class/vfio", fmt.Sprint(v.group)),
		filepath.Join(v.parent.dir, v.uuid),
		filepath.Join(k.tree.dev.Root, "vfio", fmt.Sprint(v.group)),
	} {
		os.RemoveAll(p)
	}
}

// remove is a write to <mdev>/remove: "1" removes the device, anything
// else is EINVAL.
func (k *mdevKernel) remove(path, dir string, data []byte) error {
	if strings.TrimSpace(string(data)) != "1" {
		return &fs.PathError{Op: "write", Path: path, Err: syscall.EINVAL}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.parents[filepath.Base(filepath.Dir(dir))]
	if p == nil || p.hosted == nil || p.hosted.uuid != filepath.Base(dir) {
		return &fs.PathError{Op: "write", Path: path, Err: syscall.ENODEV}
	}
	v := p.hosted
	k.unpublish(v)
	delete(k.groups, v.group)
	p.hosted = nil
	d := p.gpu
	d.Lock()
	d.active = slices.DeleteFunc(d.active, func(o *vgpuInstance) bool { return o == v })
	d.Unlock()
	k.refreshLocked(d)
	return nil
}
