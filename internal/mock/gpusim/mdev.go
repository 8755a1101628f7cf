// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/hwdra/hwdra/internal/mock/nodefs"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

// The vGPU host's sysfs, as the NVIDIA vGPU manager lays it out on the
// SR-IOV GPUs of Ampere and later (all the mock's models): the GPU's
// physical function has virtual functions (virtfn<i>, at function offset
// 4, stride 1, as on an H100), each VF is an mdev parent
// (class/mdev_bus/<vf>) whose mdev_supported_types/nvidia-<type ID>/ list
// every vGPU type with available_instances 0 or 1: one vGPU per VF.
// Pre-Ampere GPUs instead have mdev_supported_types on the GPU's own
// function, with available_instances counting up to the type's maximum;
// the mock builds no such board.
//
// Writing a UUID to a type's create file is what the kernel's mdev core
// and the vendor driver answer here (see SysfsWriter): the mediated device
// appears at <vf>/<uuid> with its links, in an IOMMU group of its own with
// a VFIO group node, and NVML lists it as an active vGPU (on a GPU
// instance, for MIG-backed types). Writing 1 to its remove file undoes it.

// vgpuInstance is a vGPU the mock's vendor driver hosts: an mdev, or a
// VF of the vendor-specific VFIO framework (vfvgpu.go).
type vgpuInstance struct {
	uuid   string
	typeID uint32
	gi     int // -1 for time-sliced types
	parent *mdevParent
	group  int // IOMMU group
}

// mdevKernel is the vGPU side of a mock node's kernel: the mdev core and
// the vendor driver's VFs of both frameworks.
type mdevKernel struct {
	mu      sync.Mutex
	sysfs   string
	tree    *nodeTree
	parents map[string]*mdevParent // by VF address
	groups  map[int]bool           // IOMMU groups of mdevs in use
	// nextVFGroup numbers the VFIO framework's VFs' IOMMU groups.
	nextVFGroup int
	rep         persist.Reporter
}

// mdevParent is one VF of a vGPU host GPU.
type mdevParent struct {
	addr   string
	dir    string // absolute device directory
	gpu    *gpu
	hosted *vgpuInstance
	// avail is each mdev type's available_instances as last written.
	avail map[uint32]int
	// vfio: a VF of the vendor-specific VFIO framework, in IOMMU group
	// group; creatable is its creatable_vgpu_types as last written.
	vfio      bool
	group     int
	creatable string
}

// IOMMU groups of the GPU side: mediated devices get theirs as they are
// created, from firstIOMMUGroup (above the node's PCI devices); the VFIO
// framework's VFs and GPUs bound to vfio-pci have theirs from the start.
// Their VFIO group nodes' minors count from firstIOMMUGroup.
const (
	firstIOMMUGroup       = 128
	firstVFIOVFGroup      = 256
	firstPassthroughGroup = 384
)

// The drivers the VFs are bound to: the vGPU manager's own (mdev
// parents), or its VFIO variant driver (the vendor-specific VFIO
// framework), which gives each VF its VFIO group node.
const (
	mdevFrameworkVFDriver = "nvidia"
	vfioFrameworkVFDriver = "nvidia_vgpu_vfio"
)

// groupMinor is the minor of an IOMMU group's VFIO group node.
func groupMinor(group int) uint32 { return uint32(group - firstIOMMUGroup) }

// buildMdevs gives every host-vGPU GPU its VFs, each an mdev parent with
// mdev types or, with the VFIO framework, a vGPU to be.
func buildMdevs(s *server.Server, sysfs string, tree *nodeTree, rep persist.Reporter) (*mdevKernel, error) {
	k := &mdevKernel{sysfs: sysfs, tree: tree, parents: map[string]*mdevParent{}, groups: map[int]bool{},
		nextVFGroup: firstVFIOVFGroup, rep: rep}
	for _, dev := range s.Devices {
		d := dev.(*gpu)
		if d.virt != nvml.GPU_VIRTUALIZATION_MODE_HOST_VGPU {
			continue
		}
		add := k.addMdevParent
		if d.vfioFramework {
			add = k.addVFIOVF
		}
		if err := k.addVFs(d, add); err != nil {
			return nil, fmt.Errorf("GPU %s: %w", d.busID, err)
		}
		d.onChange = func() { k.refresh(d) }
		k.refresh(d)
	}
	return k, os.MkdirAll(filepath.Join(k.sysfs, "bus/mdev/devices"), 0o755)
}

// addVFs creates a GPU's VFs: as many as its largest vGPU type has
// instances (an H100 has 32, of which at most 20 can host a 4C vGPU),
// each made a vGPU parent of its framework by add.
func (k *mdevKernel) addVFs(d *gpu, add func(d *gpu, addr, vfDir string) error) error {
	n := 0
	for _, t := range d.vgpus {
		m, _ := t.GetMaxInstances(d)
		n = max(n, m)
	}
	pfDir, err := filepath.EvalSymlinks(filepath.Join(k.sysfs, "bus/pci/devices", d.busID))
	if err != nil {
		return err
	}
	var domain, bus, dev, fn int
	_, _ = fmt.Sscanf(d.busID, "%04x:%02x:%02x.%x", &domain, &bus, &dev, &fn) // the model's own address: always parses
	for name, v := range map[string]string{"sriov_totalvfs": fmt.Sprint(n), "sriov_numvfs": fmt.Sprint(n)} {
		if err := writeFile(filepath.Join(pfDir, name), v+"\n"); err != nil {
			return err
		}
	}
	rel, _ := filepath.Rel(k.sysfs, pfDir)
	parts := strings.Split(rel, string(filepath.Separator)) // devices/<root>[/<bridge>]/<pf>
	pd := nodefs.PCIDevice{Root: parts[1], NUMANode: d.numa, Vendor: "0x10de",
		Device: fmt.Sprintf("0x%04x", d.Config.PciDeviceId>>16), Class: "0x030200", Driver: mdevFrameworkVFDriver}
	if d.vfioFramework {
		pd.Driver = vfioFrameworkVFDriver
	}
	if len(parts) == 4 {
		pd.Bridge = parts[2]
	}
	for i := 0; i < n; i++ {
		devfn := dev<<3 | fn + 4 + i
		pd.Address = fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus, devfn>>3, devfn&7)
		if err := nodefs.WritePCIDevice(k.sysfs, pd); err != nil {
			return err
		}
		vfDir := filepath.Join(k.sysfs, pd.Path())
		if err := os.Symlink("../"+d.busID, filepath.Join(vfDir, "physfn")); err != nil {
			return err
		}
		if err := os.Symlink("../"+pd.Address, filepath.Join(pfDir, fmt.Sprintf("virtfn%d", i))); err != nil {
			return err
		}
		if err := add(d, pd.Address, vfDir); err != nil {
			return err
		}
	}
	return nil
}

// addMdevParent makes a VF an mdev parent with every vGPU type.
func (k *mdevKernel) addMdevParent(d *gpu, addr, vfDir string) error {
	if err := k.link(filepath.Join("class/mdev_bus", addr), vfDir); err != nil {
		return err
	}
	for _, t := range d.vgpus {
		if err := k.writeType(vfDir, d, t); err != nil {
			return err
		}
	}
	k.parents[addr] = &mdevParent{addr: addr, dir: vfDir, gpu: d, avail: map[uint32]int{}}
	return nil
}

func typeDirName(id uint32) string { return fmt.Sprintf("nvidia-%d", id) }

func (k *mdevKernel) writeType(vfDir string, d *gpu, t nvml.VgpuTypeId) error {
	dir := filepath.Join(vfDir, "mdev_supported_types", typeDirName(t.GetID()))
	name, _ := t.GetName()
	fb, _ := t.GetFramebufferSize()
	maxInst, _ := t.GetMaxInstances(d)
	files := map[string]string{
		"name":                name,
		"device_api":          "vfio-pci",
		"description":         fmt.Sprintf("num_heads=1, frl_config=60, framebuffer=%dM, max_resolution=4096x2160, max_instance=%d", fb>>20, maxInst),
		"available_instances": "0",
		"create":              "",
	}
	for f, v := range files {
		if err := writeFile(filepath.Join(dir, f), v+"\n"); err != nil {
			return err
		}
	}
	return os.MkdirAll(filepath.Join(dir, "devices"), 0o755)
}

// link makes sysfs/<name> a relative symlink to target (absolute).
func (k *mdevKernel) link(name, target string) error {
	path := filepath.Join(k.sysfs, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(path), target)
	if err != nil {
		return err
	}
	return os.Symlink(rel, path)
}

// refresh rewrites available_instances of the GPU's VFs from the
// hardware's state, as the vendor driver computes them on each read.
func (k *mdevKernel) refresh(d *gpu) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refreshLocked(d)
}

func (k *mdevKernel) refreshLocked(d *gpu) {
	fits := map[uint32]bool{}
	for _, t := range d.vgpus {
		fits[t.GetID()] = k.available(d, t)
	}
	for _, p := range k.parents {
		if p.gpu != d {
			continue
		}
		if p.vfio {
			k.writeCreatable(p, fits)
			continue
		}
		for _, t := range d.vgpus {
			n := 0
			if p.hosted == nil && fits[t.GetID()] {
				n = 1
			}
			if n == p.avail[t.GetID()] {
				continue // files start at 0
			}
			path := filepath.Join(p.dir, "mdev_supported_types", typeDirName(t.GetID()), "available_instances")
			// Remembered only once written: a failed write is tried again
			// at the next change.
			if os.WriteFile(path, []byte(fmt.Sprintf("%d\n", n)), 0o644) == nil {
				p.avail[t.GetID()] = n
			}
		}
	}
}

// available tells whether one more vGPU of type t fits the GPU:
//   - time-sliced types need MIG mode off, fewer than the type's maximum,
//     and, without heterogeneous mode, no time-sliced vGPU of another type;
//   - MIG-backed types need MIG mode on and a GPU instance of their
//     profile that hosts no vGPU yet.
func (k *mdevKernel) available(d *gpu, t nvml.VgpuTypeId) bool {
	giProfile, _ := t.GetGpuInstanceProfileId()
	d.RLock()
	defer d.RUnlock()
	mig := d.migCurrent == nvml.DEVICE_MIG_ENABLE
	if giProfile == invalidGIProfileID {
		maxInst, _ := t.GetMaxInstances(d)
		same := 0
		for _, v := range d.active {
			if v.typeID == t.GetID() {
				same++
			} else if v.gi < 0 && !d.heterogeneous {
				return false
			}
		}
		return !mig && same < maxInst
	}
	return mig && d.freeGILocked(giProfile) >= 0
}

// freeGILocked is the lowest-ID GPU instance of a driver profile ID that
// hosts no vGPU, or -1.
func (d *gpu) freeGILocked(profileID uint32) int {
	for _, gi := range d.instancesLocked() {
		if gi.Info.ProfileId == profileID && !d.hostsVGPULocked(int(gi.Info.Id)) {
			return int(gi.Info.Id)
		}
	}
	return -1
}

// hostsVGPULocked: a vGPU runs on GPU instance gi.
func (d *gpu) hostsVGPULocked(gi int) bool {
	return slices.ContainsFunc(d.active, func(v *vgpuInstance) bool { return v.gi == gi })
}

// notify tells the mdev emulation that MIG state changed; the caller
// holds no device lock.
func (d *gpu) notify() {
	if d.onChange != nil {
		d.onChange()
	}
}

// activeVGPUs answers nvmlDeviceGetActiveVgpus.
func (d *gpu) activeVGPUs() ([]nvml.VgpuInstance, nvml.Return) {
	if d.virt != nvml.GPU_VIRTUALIZATION_MODE_HOST_VGPU {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	d.RLock()
	defer d.RUnlock()
	out := make([]nvml.VgpuInstance, 0, len(d.active))
	for _, v := range d.active {
		gi := v.gi
		if gi < 0 {
			gi = invalidGIProfileID // INVALID_GPU_INSTANCE_ID for time-sliced vGPUs
		}
		var typ nvml.VgpuTypeId
		for _, t := range d.vgpus {
			if t.GetID() == v.typeID {
				typ = t
			}
		}
		mdev := func() (string, nvml.Return) { return v.uuid, nvml.SUCCESS }
		if v.parent.vfio {
			// A VF of the VFIO framework is no mediated device.
			mdev = func() (string, nvml.Return) { return "", nvml.ERROR_NOT_SUPPORTED }
		}
		out = append(out, &mock.VgpuInstance{
			GetMdevUUIDFunc:      mdev,
			GetUUIDFunc:          func() (string, nvml.Return) { return v.uuid, nvml.SUCCESS },
			GetGpuInstanceIdFunc: func() (int, nvml.Return) { return gi, nvml.SUCCESS },
			GetTypeFunc:          func() (nvml.VgpuTypeId, nvml.Return) { return typ, nvml.SUCCESS },
		})
	}
	return out, nvml.SUCCESS
}
