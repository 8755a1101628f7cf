// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package gpusim simulates a node's NVIDIA GPUs under go-nvml's mock
// server: each GPU answers and refuses as the hardware does (MIG modes,
// GPU and compute instances with their placements and IDs, vGPU types,
// events, XIDs, a GPU lost from the bus, the driver not loaded), with the
// driver's files (/proc MIG capabilities, /dev nodes) and, on a vGPU host,
// the mediated devices the kernel's mdev core makes through sysfs. It
// reports every change to a persist.Reporter.
package gpusim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/hwdra/hwdra/internal/mock/model"
	"github.com/hwdra/hwdra/internal/mock/nodefs"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/mock/profile"
)

// GPUs is a mock node's GPU side.
type GPUs struct {
	// NVML is the node's NVML library: go-nvml's mock server with every
	// GPU wrapped, or without GPUs one whose Init fails.
	NVML nvml.Interface
	// DriverVersion is the driver version NVML reports; "" without GPUs
	// for NVML.
	DriverVersion string
	profile       string // the profile's name, for errors
	sysfs         string
	srv           *server.Server // nil without GPUs
	// busIDs are every GPU's address in the profile's order, those
	// bound to vfio-pci (not in NVML) too.
	busIDs []string
	driver *driverGate // nil without GPUs
	// module is the kernel module's version file, there while the
	// driver is loaded ("" without GPUs for NVML).
	module string
	kernel *mdevKernel // nil without GPUs
	rep    persist.Reporter
}

// dgxBusIDs are the GPUs' PCI addresses in a DGX H100, in NVML index
// order; GPUs without pciBusIDs get them in turn across the profile's
// groups, the first four on NUMA node 0 and the rest on node 1 as in a
// DGX, and then buses up to ff (extraBus), as many as
// profile.MaxDefaultGPUAddresses allows.
var dgxBusIDs = []string{
	"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
	"0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0",
}

// extraBus+n is the bus of the n-th GPU without pciBusIDs past the DGX
// addresses: the last one allowed gets bus ff.
const extraBus = 0x100 - profile.MaxDefaultGPUAddresses

// slot is one GPU of the profile, with its place on the node.
type slot struct {
	group        int
	model        *model.GPU
	busID        string
	numa         int
	root, bridge string
}

// layoutGPUs assigns PCI addresses, NUMA nodes and PCIe roots. Every pair
// of GPUs (in index order) shares a PCIe root complex, distinct per pair,
// as the GPU pairs behind one PCIe switch do in a DGX.
func layoutGPUs(p profile.Profile) ([]slot, error) {
	var out []slot
	used := map[string]int{}
	next := 0
	for gi, g := range p.GPUs {
		for i := 0; i < g.Count; i++ {
			m, _ := model.LookupGPU(g.Model) // validated with the profile
			at := slot{group: gi, model: m}
			switch {
			case g.PCIBusIDs != nil:
				at.busID = g.PCIBusIDs[i]
			case next < len(dgxBusIDs):
				at.busID = dgxBusIDs[next]
				at.numa = next / 4
				next++
			default:
				at.busID = fmt.Sprintf("0000:%02x:00.0", extraBus+next) // after the DGX slots
				next++
			}
			if g.NUMANodes != nil {
				at.numa = g.NUMANodes[i]
			}
			if j, dup := used[at.busID]; dup {
				return nil, fmt.Errorf("gpus[%d]: PCI address %s is already used by gpus[%d]", gi, at.busID, j)
			}
			used[at.busID] = gi
			out = append(out, at)
		}
	}
	roots := map[int]bool{}
	for k := 0; k < len(out); k += 2 {
		var domain, bus int
		_, _ = fmt.Sscanf(out[k].busID, "%04x:%02x", &domain, &bus) // built above: always parses
		root := bus &^ 0xf
		for roots[root] && root < bus {
			root++
		}
		roots[root] = true
		for i := k; i < k+2 && i < len(out); i++ {
			out[i].root = fmt.Sprintf("pci%04x:%02x", domain, root)
			out[i].bridge = fmt.Sprintf("%04x:%02x:%02x.0", domain, root, 1+i-k)
		}
	}
	return out, nil
}

// Build creates the GPUs of a profile: their NVML, their PCI functions in
// the sysfs tree at sysfs, the driver's files under proc and its device
// nodes in dev. rep is told of every change (persist.Discard: none). A
// profile without GPUs gets an NVML whose Init fails as on a node without
// the driver.
func Build(p profile.Profile, sysfs, proc string, dev *nodefs.Dev, rep persist.Reporter) (*GPUs, error) {
	g := &GPUs{profile: p.Name, sysfs: sysfs, rep: rep}
	if len(p.GPUs) == 0 {
		g.NVML = noNVML()
		return g, nil
	}
	all, err := layoutGPUs(p)
	if err != nil {
		return nil, err
	}
	// GPUs bound to vfio-pci are on the bus only: NVML does not see them.
	var layout, passthrough []slot
	for _, l := range all {
		g.busIDs = append(g.busIDs, l.busID)
		if p.GPUs[l.group].Virtualization == profile.VirtualizationPassthrough {
			passthrough = append(passthrough, l)
		} else {
			layout = append(layout, l)
		}
	}
	if err := writePassthrough(sysfs, dev, passthrough); err != nil {
		return nil, err
	}
	if len(layout) == 0 {
		g.NVML = noNVML() // no GPU for the NVIDIA driver: not installed
		return g, nil
	}
	// Driver 550 (CUDA 12.4) unless a Blackwell board needs 570 (CUDA 12.8).
	driver, cuda := "550.54.15", 12040
	configs := make([]gpus.Config, len(layout))
	for i, l := range layout {
		configs[i] = l.model.NVMLConfig()
		if l.model.Config.Architecture >= nvml.DEVICE_ARCH_BLACKWELL {
			driver, cuda = "570.133.20", 12080
		}
	}
	s, err := server.New(server.WithGPUs(configs...), server.WithDriverVersion(driver),
		server.WithNVMLVersion("12."+driver), server.WithCUDADriverVersion(cuda))
	if err != nil {
		return nil, err
	}
	g.DriverVersion = driver
	installServer(s)
	installLostLookups(s)
	tree := &nodeTree{proc: proc, dev: dev}
	if err := buildGPUs(p, s, layout, sysfs, tree, rep); err != nil {
		return nil, err
	}
	g.srv, g.NVML, g.driver = s, s, gateOnDriver(s)
	g.module = filepath.Join(proc, moduleVersionFile)
	if err := g.loadModule(true); err != nil {
		return nil, err
	}
	if g.kernel, err = buildMdevs(s, sysfs, tree, rep); err != nil {
		return nil, err
	}
	return g, nil
}

// buildGPUs makes each of layout's GPUs of s one of ours in its start
// state, with its PCI function in the sysfs tree, and the driver's files
// and device nodes in tree.
func buildGPUs(p profile.Profile, s *server.Server, layout []slot, sysfs string, tree *nodeTree, rep persist.Reporter) error {
	vgpuIDs := map[string]uint32{}
	var minors []int
	vfio := false
	for i, l := range layout {
		group := p.GPUs[l.group]
		d := newGPU(s.Devices[i].(*server.Device), l.model, p.Name, l.busID, l.numa)
		d.installHealth(group.NoRecoveryAction)
		d.tree = tree
		d.rep = rep
		s.Devices[i] = d
		minors = append(minors, d.Minor)
		vfio = vfio || group.Virtualization == profile.VirtualizationHostVGPU
		if err := setupGPU(d, group, vgpuIDs); err != nil {
			return fmt.Errorf("gpus[%d] (%s): %w", l.group, l.busID, err)
		}
		if err := nodefs.WritePCIDevice(sysfs, nodefs.PCIDevice{
			Address: l.busID, Root: l.root, Bridge: l.bridge, NUMANode: l.numa,
			Vendor: "0x10de", Device: fmt.Sprintf("0x%04x", l.model.Config.PciDeviceId>>16),
			Class: "0x030200", Driver: "nvidia",
		}); err != nil {
			return err
		}
	}
	return tree.setup(minors, vfio)
}

// setupGPU puts one GPU in the group's start state: virtualization, vGPU
// types, MIG mode and pre-existing instances (each with one full-size
// compute instance), created through the mock's own refusing calls.
func setupGPU(d *gpu, g profile.GPUGroup, vgpuIDs map[string]uint32) error {
	if g.Virtualization == profile.VirtualizationHostVGPU {
		d.virt = nvml.GPU_VIRTUALIZATION_MODE_HOST_VGPU
		d.heterogeneous = g.VGPUHeterogeneous
		d.vfioFramework = g.VGPUFramework == profile.VGPUFrameworkVFIO
		types := g.VGPUTypes
		if len(types) == 0 {
			types = defaultVGPUTypes(d.model)
		}
		for _, t := range types {
			id, ok := vgpuIDs[t.Name]
			if !ok {
				id = uint32(800 + len(vgpuIDs)) // type IDs are node-wide, as in the driver
				vgpuIDs[t.Name] = id
			}
			d.vgpus = append(d.vgpus, d.vgpuTypeID(id, t))
		}
	}
	if !g.MIG {
		return nil
	}
	d.migCurrent, d.migPending, d.MigMode = nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE
	for i, mi := range g.MIGInstances {
		p, _ := d.model.ProfileByName(mi.Profile)
		info := p.GIInfo()
		gi, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(mi.Start), Size: uint32(p.Size)})
		if ret != nvml.SUCCESS {
			return fmt.Errorf("migInstances[%d]: creating %s: %v", i, mi.Profile, ret)
		}
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(model.CIProfileIndex[p.Slices], nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS {
			_, ret = gi.CreateComputeInstance(&ciInfo)
		}
		if ret != nvml.SUCCESS {
			return fmt.Errorf("migInstances[%d]: compute instance in %s: %v", i, mi.Profile, ret)
		}
	}
	return nil
}

// BusIDs are the GPUs' PCI addresses in the profile's order of groups
// and GPUs, which is NVML's index order for those NVML sees (not the
// ones bound to vfio-pci).
func (g *GPUs) BusIDs() []string { return g.busIDs }

// Reset resets the GPU at a PCI address (any form NVML accepts), like
// `nvidia-smi --gpu-reset`: a pending MIG mode takes effect and MIG
// instances, which do not survive a reset, are gone.
func (g *GPUs) Reset(busID string) error {
	d, err := g.find(busID)
	if err != nil {
		return fmt.Errorf("reset GPU %s: %w", busID, err)
	}
	d.reset()
	d.changed(persist.CallResetGPU, true)
	return nil
}

// all are the GPUs in NVML index order (none without GPUs).
func (g *GPUs) all() []*gpu {
	if g.srv == nil {
		return nil
	}
	out := make([]*gpu, len(g.srv.Devices))
	for i, d := range g.srv.Devices {
		out[i] = d.(*gpu)
	}
	return out
}

// find returns the mock GPU at a PCI address (any form NVML accepts),
// lost or not, without asking NVML: the mock's own calls work while the
// driver is not loaded.
func (g *GPUs) find(busID string) (*gpu, error) {
	if g.srv == nil {
		return nil, fmt.Errorf("mock profile %q has no GPUs", g.profile)
	}
	want, ok := nodefs.CanonicalAddress(busID)
	if !ok {
		return nil, fmt.Errorf("GPU %q: not a PCI address like 0000:1b:00.0", busID)
	}
	var have []string
	for _, d := range g.all() {
		if d.busID == want {
			return d, nil
		}
		have = append(have, d.busID)
	}
	return nil, fmt.Errorf("no GPU %s (the GPUs: %s)", busID, strings.Join(have, ", "))
}

// MdevUUIDs lists the mediated devices that exist, sorted.
func (g *GPUs) MdevUUIDs() []string {
	entries, _ := os.ReadDir(filepath.Join(g.sysfs, "bus/mdev/devices"))
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// noNVML is the NVML of a node without the NVIDIA driver: Init fails with
// ERROR_LIBRARY_NOT_FOUND, and every other call panics, standing in for
// the process death that any other call causes on such a node.
func noNVML() *mock.Interface {
	fail := func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	return &mock.Interface{
		InitFunc:          fail,
		InitWithFlagsFunc: func(uint32) nvml.Return { return fail() },
	}
}
