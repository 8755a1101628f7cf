package mock

import (
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// dgxBusIDs are the GPUs' PCI addresses in a DGX H100, in NVML index
// order; GPUs without pciBusIDs get them in turn across the profile's
// groups, the first four on NUMA node 0 and the rest on node 1 as in a
// DGX.
var dgxBusIDs = []string{
	"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
	"0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0",
}

// validate checks one GPU group; errors start with the field name.
func (g GPUGroup) validate() error {
	m, ok := models[g.Model]
	if !ok {
		return fmt.Errorf("model: unknown GPU model %q (known: %s)", g.Model, strings.Join(Models(), ", "))
	}
	if g.Count < 1 {
		return fmt.Errorf("count: must be at least 1, is %d", g.Count)
	}
	if g.PCIBusIDs != nil && len(g.PCIBusIDs) != g.Count {
		return fmt.Errorf("pciBusIDs: has %d entries, count is %d", len(g.PCIBusIDs), g.Count)
	}
	for i, id := range g.PCIBusIDs {
		if c, ok := canonicalBusID(id); !ok || c != id {
			return fmt.Errorf("pciBusIDs[%d]: %q is not a lower-case PCI address like 0000:1b:00.0", i, id)
		}
		if j := slices.Index(g.PCIBusIDs, id); j < i {
			return fmt.Errorf("pciBusIDs[%d]: %s is also pciBusIDs[%d]", i, id, j)
		}
	}
	if g.NUMANodes != nil && len(g.NUMANodes) != g.Count {
		return fmt.Errorf("numaNodes: has %d entries, count is %d", len(g.NUMANodes), g.Count)
	}
	for i, n := range g.NUMANodes {
		if n < -1 {
			return fmt.Errorf("numaNodes[%d]: %d is not a NUMA node (-1 for none)", i, n)
		}
	}
	if err := g.validateMIG(m); err != nil {
		return err
	}
	if err := g.Timings.validate(); err != nil {
		return err
	}
	return g.validateVGPU(m)
}

func (g GPUGroup) validateMIG(m *gpuModel) error {
	if len(g.MIGInstances) > 0 && !g.MIG {
		return fmt.Errorf("migInstances: need mig: true")
	}
	var existing []placed
	for i, mi := range g.MIGInstances {
		p, ok := m.profileByName(mi.Profile)
		if !ok {
			return fmt.Errorf("migInstances[%d]: profile %q not offered by %s (offered: %s)",
				i, mi.Profile, m.name, strings.Join(m.profileNames(), ", "))
		}
		if !slices.Contains(p.starts, mi.Start) {
			return fmt.Errorf("migInstances[%d]: start %d is not a placement of %s on %s (starts: %s)",
				i, mi.Start, p.name, m.name, strings.Trim(fmt.Sprint(p.starts), "[]"))
		}
		pl := nvml.GpuInstancePlacement{Start: uint32(mi.Start), Size: uint32(p.size)}
		for j, e := range existing {
			if giOverlap(e.pl, pl) {
				return fmt.Errorf("migInstances[%d]: %s at %d overlaps migInstances[%d] (%s at %d)",
					i, p.name, mi.Start, j, e.p.name, e.pl.Start)
			}
		}
		if m.fits(existing, p, pl) != nvml.SUCCESS {
			return fmt.Errorf("migInstances[%d]: no room for %s on %s (at most %d instances, %d compute slices in all)",
				i, p.name, m.name, p.count, m.computeSlices)
		}
		existing = append(existing, placed{p, pl})
	}
	return nil
}

func (g GPUGroup) validateVGPU(m *gpuModel) error {
	switch g.Virtualization {
	case "", "none", "host-vgpu":
	default:
		return fmt.Errorf("virtualization: unknown mode %q (known: none, host-vgpu)", g.Virtualization)
	}
	host := g.Virtualization == "host-vgpu"
	if len(g.VGPUTypes) > 0 && !host {
		return fmt.Errorf("vgpuTypes: need virtualization: host-vgpu")
	}
	if g.VGPUHeterogeneous && !host {
		return fmt.Errorf("vgpuHeterogeneous: need virtualization: host-vgpu")
	}
	if g.VGPUHeterogeneous && !m.hopperOrLater() {
		return fmt.Errorf("vgpuHeterogeneous: %s has no heterogeneous vGPU mode (Hopper and later have)", m.name)
	}
	for i, t := range g.VGPUTypes {
		switch {
		case t.Name == "":
			return fmt.Errorf("vgpuTypes[%d].name: must be set", i)
		case slices.IndexFunc(g.VGPUTypes, func(o VGPUType) bool { return o.Name == t.Name }) < i:
			return fmt.Errorf("vgpuTypes[%d].name: %q appears twice", i, t.Name)
		case t.FramebufferMB == 0:
			return fmt.Errorf("vgpuTypes[%d].framebufferMB: must be more than 0", i)
		case t.MaxInstances < 1:
			return fmt.Errorf("vgpuTypes[%d].maxInstances: must be at least 1", i)
		}
		if _, ok := m.profileByName(t.MIGProfile); t.MIGProfile != "" && !ok {
			return fmt.Errorf("vgpuTypes[%d].migProfile: %q not offered by %s (offered: %s)",
				i, t.MIGProfile, m.name, strings.Join(m.profileNames(), ", "))
		}
	}
	return nil
}

// mockGPU is one GPU of the profile, with its place on the node.
type mockGPU struct {
	group        int
	model        *gpuModel
	busID        string
	numa         int
	root, bridge string
}

// layoutGPUs assigns PCI addresses, NUMA nodes and PCIe roots. Every pair
// of GPUs (in index order) shares a PCIe root complex, distinct per pair,
// as the GPU pairs behind one PCIe switch do in a DGX.
func (p Profile) layoutGPUs() ([]mockGPU, error) {
	var out []mockGPU
	used := map[string]int{}
	next := 0
	for gi, g := range p.GPUs {
		for i := 0; i < g.Count; i++ {
			gpu := mockGPU{group: gi, model: models[g.Model]}
			switch {
			case g.PCIBusIDs != nil:
				gpu.busID = g.PCIBusIDs[i]
			case next < len(dgxBusIDs):
				gpu.busID = dgxBusIDs[next]
				gpu.numa = next / 4
				next++
			default:
				gpu.busID = fmt.Sprintf("0000:%02x:00.0", 0xe0+len(out)) // after the DGX slots
			}
			if g.NUMANodes != nil {
				gpu.numa = g.NUMANodes[i]
			}
			if j, dup := used[gpu.busID]; dup {
				return nil, fmt.Errorf("gpus[%d]: PCI address %s is already used by gpus[%d]", gi, gpu.busID, j)
			}
			used[gpu.busID] = gi
			out = append(out, gpu)
		}
	}
	roots := map[int]bool{}
	for k := 0; k < len(out); k += 2 {
		var domain, bus int
		fmt.Sscanf(out[k].busID, "%04x:%02x", &domain, &bus)
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

// buildGPUs creates h.NVML and the GPUs' sysfs entries. A profile without
// GPUs gets an NVML whose Init fails as on a node without the driver.
func (h *Hardware) buildGPUs() error {
	if len(h.Profile.GPUs) == 0 {
		h.NVML = noNVML()
		return nil
	}
	layout, err := h.Profile.layoutGPUs()
	if err != nil {
		return err
	}
	// Driver 550 (CUDA 12.4) unless a Blackwell board needs 570 (CUDA 12.8).
	driver, cuda := "550.54.15", 12040
	configs := make([]gpus.Config, len(layout))
	for i, g := range layout {
		configs[i] = g.model.nvmlConfig()
		if g.model.config.Architecture >= nvml.DEVICE_ARCH_BLACKWELL {
			driver, cuda = "570.133.20", 12080
		}
	}
	s, err := server.New(server.WithGPUs(configs...), server.WithDriverVersion(driver),
		server.WithNVMLVersion("12."+driver), server.WithCUDADriverVersion(cuda))
	if err != nil {
		return err
	}
	installServer(s)
	installLostLookups(s)
	vgpuIDs := map[string]uint32{}
	tree := h.nodeTree()
	var minors []int
	vfio := false
	for i, g := range layout {
		group := h.Profile.GPUs[g.group]
		d := newGPUDevice(s.Devices[i].(*server.Device), g.model, h.Profile.Name, g.busID, g.numa)
		d.installHealth(group.NoRecoveryAction)
		d.tree = tree
		d.ctl = h.ctl
		s.Devices[i] = d
		minors = append(minors, d.Minor)
		vfio = vfio || group.Virtualization == "host-vgpu"
		if err := h.setupGPU(d, group, vgpuIDs); err != nil {
			return fmt.Errorf("gpus[%d] (%s): %w", g.group, g.busID, err)
		}
		if err := writePCIDevice(h.Sysfs, pciDevice{
			Address: g.busID, Root: g.root, Bridge: g.bridge, NUMANode: g.numa,
			Vendor: "0x10de", Device: fmt.Sprintf("0x%04x", g.model.config.PciDeviceId>>16),
			Class: "0x030200", Driver: "nvidia",
		}); err != nil {
			return err
		}
	}
	if err := tree.setup(minors, vfio); err != nil {
		return err
	}
	h.driver = gateOnDriver(s)
	h.NVML = s
	return h.buildMdevs(s)
}

// setupGPU puts one GPU in the group's start state: virtualization, vGPU
// types, MIG mode and pre-existing instances (each with one full-size
// compute instance), created through the mock's own refusing calls.
func (h *Hardware) setupGPU(d *gpuDevice, g GPUGroup, vgpuIDs map[string]uint32) error {
	if g.Virtualization == "host-vgpu" {
		d.virt = nvml.GPU_VIRTUALIZATION_MODE_HOST_VGPU
		d.heterogeneous = g.VGPUHeterogeneous
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
		p, _ := d.model.profileByName(mi.Profile)
		info := p.giInfo()
		gi, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(mi.Start), Size: uint32(p.size)})
		if ret != nvml.SUCCESS {
			return fmt.Errorf("migInstances[%d]: creating %s: %v", i, mi.Profile, ret)
		}
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfileIndex[p.slices], nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS {
			_, ret = gi.CreateComputeInstance(&ciInfo)
		}
		if ret != nvml.SUCCESS {
			return fmt.Errorf("migInstances[%d]: compute instance in %s: %v", i, mi.Profile, ret)
		}
	}
	return nil
}

// ResetGPU resets the GPU at a PCI address (any form NVML accepts), like
// `nvidia-smi --gpu-reset`: a pending MIG mode takes effect and MIG
// instances, which do not survive a reset, are gone.
func (h *Hardware) ResetGPU(busID string) error {
	d, err := h.gpu(busID)
	if err != nil {
		return fmt.Errorf("reset GPU %s: %w", busID, err)
	}
	d.reset()
	d.ctl.changed(opResetGPU, d.busID, true)
	return nil
}

// SetRunningProcesses makes the GPU at a PCI address report these process
// IDs as running compute work on it (none: idle). The hardware refuses to
// switch MIG mode while any run.
func (h *Hardware) SetRunningProcesses(busID string, pids ...uint32) error {
	d, err := h.gpu(busID)
	if err != nil {
		return err
	}
	d.Lock()
	d.processes = nil
	for _, pid := range pids {
		d.processes = append(d.processes, nvml.ProcessInfo{Pid: pid})
	}
	d.Unlock()
	d.ctl.changed(opSetRunningProcesses, d.busID, true)
	return nil
}

// gpu returns the mock GPU at a PCI address (any form NVML accepts), lost
// or not, without asking NVML: the mock's own calls work while the driver
// is not loaded.
func (h *Hardware) gpu(busID string) (*gpuDevice, error) {
	s, ok := h.NVML.(*server.Server)
	if !ok {
		return nil, fmt.Errorf("mock profile %q has no GPUs", h.Profile.Name)
	}
	want, ok := canonicalBusID(busID)
	if !ok {
		return nil, fmt.Errorf("GPU %q: not a PCI address like 0000:1b:00.0", busID)
	}
	var have []string
	for _, d := range s.Devices {
		if d.(*gpuDevice).busID == want {
			return d.(*gpuDevice), nil
		}
		have = append(have, d.(*gpuDevice).busID)
	}
	return nil, fmt.Errorf("no GPU %s (the GPUs: %s)", busID, strings.Join(have, ", "))
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
