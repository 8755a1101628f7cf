// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/uuid"

	"github.com/hwdra/hwdra/internal/mock/nodefs"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

// NVIDIA's vendor-specific VFIO framework (the vGPU manager of R550 and
// later on Ada, Hopper and Blackwell, on kernels where it replaces mdev;
// NVIDIA vGPU user guide, "Creating an NVIDIA vGPU on a Linux with KVM
// Hypervisor that uses a vendor-specific VFIO framework"): the GPU's VFs
// are bound to the vGPU manager's VFIO variant driver, each in an IOMMU
// group of its own with its VFIO group node from the start, and each has
// a directory nvidia/ with
//
//	creatable_vgpu_types  "ID    : vGPU Name", then one "<ID> : <name>"
//	                      line per type this VF can become now
//	current_vgpu_type     "0", or the ID of the type the VF is
//
// The mock's vendor driver answers writes to current_vgpu_type (through
// SysfsWriter) as the driver does:
//   - not a number: EINVAL;
//   - 0: the VF stops being a vGPU (a VF that is none stays so);
//   - a type ID while the VF is a vGPU: EBUSY (0 must be written first);
//   - a type ID the VF does not list as creatable (time-sliced types of
//     another size than those running, without heterogeneous mode; a
//     type at its maximum; MIG-backed types without a free GPU instance
//     of their profile, or with MIG mode off; time-sliced ones with it
//     on): EINVAL;
//   - otherwise the VF becomes a vGPU of that type, on the lowest-ID
//     free GPU instance of its profile for a MIG-backed one, and NVML
//     lists it as active. Every VF's creatable list shrinks to match.
const creatableHeader = "ID    : vGPU Name\n"

// addVFIOVF makes a VF a vGPU-to-be of the VFIO framework.
func (k *mdevKernel) addVFIOVF(d *gpu, addr, vfDir string) error {
	group := k.nextVFGroup
	k.nextVFGroup++
	if err := nodefs.LinkIOMMUGroup(k.sysfs, vfDir, addr, group); err != nil {
		return err
	}
	if err := k.tree.dev.VFIOGroup(k.sysfs, group, groupMinor(group), false); err != nil {
		return err
	}
	for name, content := range map[string]string{"creatable_vgpu_types": creatableHeader, "current_vgpu_type": "0\n"} {
		if err := writeFile(filepath.Join(vfDir, "nvidia", name), content); err != nil {
			return err
		}
	}
	k.parents[addr] = &mdevParent{addr: addr, dir: vfDir, gpu: d, vfio: true, group: group, creatable: creatableHeader}
	return nil
}

// writeCreatable rewrites a VFIO framework VF's creatable_vgpu_types from
// which types fit the GPU now: none while the VF is a vGPU.
func (k *mdevKernel) writeCreatable(p *mdevParent, fits map[uint32]bool) {
	var b strings.Builder
	b.WriteString(creatableHeader)
	if p.hosted == nil {
		for _, t := range p.gpu.vgpus {
			if fits[t.GetID()] {
				name, _ := t.GetName()
				fmt.Fprintf(&b, "%-5d : %s\n", t.GetID(), name)
			}
		}
	}
	if b.String() == p.creatable {
		return
	}
	// Remembered only once written: a failed write is tried again at the
	// next change.
	if os.WriteFile(filepath.Join(p.dir, "nvidia", "creatable_vgpu_types"), []byte(b.String()), 0o644) == nil {
		p.creatable = b.String()
	}
}

// setType is a write to <vf>/nvidia/current_vgpu_type.
func (k *mdevKernel) setType(path, vf string, data []byte) error {
	id, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 32)
	if err != nil {
		return &fs.PathError{Op: "write", Path: path, Err: syscall.EINVAL}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.parents[vf]
	if p == nil || !p.vfio {
		return &fs.PathError{Op: "write", Path: path, Err: syscall.ENODEV}
	}
	d := p.gpu
	if id == 0 {
		if p.hosted != nil {
			return k.unassign(p)
		}
		return nil
	}
	if p.hosted != nil {
		return &fs.PathError{Op: "write", Path: path, Err: syscall.EBUSY}
	}
	i := slices.IndexFunc(d.vgpus, func(t nvml.VgpuTypeId) bool { return uint64(t.GetID()) == id })
	if i < 0 || !k.available(d, d.vgpus[i]) {
		return &fs.PathError{Op: "write", Path: path, Err: syscall.EINVAL}
	}
	v := &vgpuInstance{uuid: uuid.NewString(), typeID: uint32(id), gi: -1, parent: p, group: p.group}
	if giProfile, _ := d.vgpus[i].GetGpuInstanceProfileId(); giProfile != invalidGIProfileID {
		d.RLock()
		v.gi = d.freeGILocked(giProfile)
		d.RUnlock()
	}
	return k.assign(v)
}

// assign makes a VF the vGPU v (its parent); a failure to show it in
// sysfs leaves the VF as it was.
func (k *mdevKernel) assign(v *vgpuInstance) error {
	p, d := v.parent, v.parent.gpu
	if err := os.WriteFile(filepath.Join(p.dir, "nvidia", "current_vgpu_type"), []byte(fmt.Sprintf("%d\n", v.typeID)), 0o644); err != nil {
		return fmt.Errorf("mock kernel: %w", err)
	}
	p.hosted = v
	d.Lock()
	d.active = append(d.active, v)
	d.Unlock()
	k.refreshLocked(d)
	return nil
}

// unassign makes a VF a vGPU no more.
func (k *mdevKernel) unassign(p *mdevParent) error {
	if err := os.WriteFile(filepath.Join(p.dir, "nvidia", "current_vgpu_type"), []byte("0\n"), 0o644); err != nil {
		return fmt.Errorf("mock kernel: %w", err)
	}
	v, d := p.hosted, p.gpu
	p.hosted = nil
	d.Lock()
	d.active = slices.DeleteFunc(d.active, func(o *vgpuInstance) bool { return o == v })
	d.Unlock()
	k.refreshLocked(d)
	return nil
}

// snapshotVFs lists the VFs that are vGPUs, by VF address.
func (k *mdevKernel) snapshotVFs() []persist.VFVGPUState {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []persist.VFVGPUState
	for _, p := range k.parents {
		v := p.hosted
		if !p.vfio || v == nil {
			continue
		}
		s := persist.VFVGPUState{VF: p.addr, GPU: p.gpu.busID, TypeID: v.typeID, GPUInstance: v.gi, UUID: v.uuid}
		for _, t := range p.gpu.vgpus {
			if t.GetID() == v.typeID {
				s.Type, _ = t.GetName()
			}
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VF < out[j].VF })
	return out
}

// restoreVFs makes saved VFs vGPUs again, after the GPUs were restored.
func (k *mdevKernel) restoreVFs(saved []persist.VFVGPUState) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, s := range saved {
		p := k.parents[s.VF]
		switch {
		case p == nil || !p.vfio:
			return fmt.Errorf("vGPU VF %s: no VF of the VFIO framework there", s.VF)
		case p.hosted != nil:
			return fmt.Errorf("vGPU VF %s saved twice", s.VF)
		case !slices.ContainsFunc(p.gpu.vgpus, func(t nvml.VgpuTypeId) bool { return t.GetID() == s.TypeID }):
			return fmt.Errorf("vGPU VF %s: GPU %s has no vGPU type %d", s.VF, p.gpu.busID, s.TypeID)
		}
		if err := k.assign(&vgpuInstance{uuid: s.UUID, typeID: s.TypeID, gi: s.GPUInstance, parent: p, group: p.group}); err != nil {
			return fmt.Errorf("vGPU VF %s: %w", s.VF, err)
		}
	}
	return nil
}

// writePassthrough lays out GPUs bound to vfio-pci: their PCI functions,
// each in an IOMMU group of its own with its VFIO group node, and
// /dev/vfio/vfio. NVML does not see them.
func writePassthrough(sysfs string, dev *nodefs.Dev, slots []slot) error {
	for i, l := range slots {
		pd := nodefs.PCIDevice{Address: l.busID, Root: l.root, Bridge: l.bridge, NUMANode: l.numa,
			Vendor: "0x10de", Device: fmt.Sprintf("0x%04x", l.model.Config.PciDeviceId>>16),
			Class: "0x030200", Driver: "vfio-pci"}
		if err := nodefs.WritePCIDevice(sysfs, pd); err != nil {
			return err
		}
		group := firstPassthroughGroup + i
		if err := nodefs.LinkIOMMUGroup(sysfs, filepath.Join(sysfs, pd.Path()), l.busID, group); err != nil {
			return err
		}
		if err := dev.VFIOGroup(sysfs, group, groupMinor(group), false); err != nil {
			return err
		}
	}
	if len(slots) == 0 {
		return nil
	}
	return dev.Node("vfio/vfio", nodefs.MiscMajor, nodefs.VFIOMiscMinor)
}

// VGPUVFs lists the VFs that are vGPUs, "<VF address>=<type ID>", sorted.
func (g *GPUs) VGPUVFs() []string {
	var out []string
	for _, s := range g.kernel.snapshotVFs() {
		out = append(out, fmt.Sprintf("%s=%d", s.VF, s.TypeID))
	}
	return out
}
