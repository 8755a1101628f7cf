package resources

import (
	"fmt"
	"sort"

	"github.com/hwdra/hwdra/slices/device"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/hw"
)

// GPU attribute and capacity names only the builders use.
const (
	attrParentUUID    = device.GPUDriver + "/parentUUID"
	attrProductName   = device.GPUDriver + "/productName"
	attrArchitecture  = device.GPUDriver + "/architecture"
	attrCUDACompute   = device.GPUDriver + "/cudaComputeCapability"
	attrDriver        = device.GPUDriver + "/driverVersion"
	attrCUDADriver    = device.GPUDriver + "/cudaDriverVersion"
	attrMIGCapable    = device.GPUDriver + "/migCapable"
	attrVGPUType      = device.GPUDriver + "/vgpuType"
	attrVGPUClass     = device.GPUDriver + "/vgpuClass"
	attrMIGBacked     = device.GPUDriver + "/migBacked"
	attrMIGProfile    = device.GPUDriver + "/migProfile" // of a MIG-backed vGPU's GPU instance
	attrVGPUFramework = device.GPUDriver + "/vgpuFramework"
	attrPCIDeviceID   = device.GPUDriver + "/pciDeviceID"
	capMemory         = device.GPUCapMemory
	capSMs            = device.GPUDriver + "/multiprocessors"
)

// Compatibility groups: devices on one GPU are co-allocated only within a
// group, so MIG partitions and vGPUs never share a GPU, and time-sliced vGPU
// types that the hardware cannot mix are not mixed.
const (
	groupMIG           = "mig"
	groupVGPUMIG       = "vgpu-mig"
	groupVGPUTimeSlice = "vgpu-timesliced"
)

// GPU builds the gpu.hwdra.io pool of a node: one counter set per
// GPU, and per GPU the whole GPU, its MIG partitions and its vGPU types, as
// far as the hardware can deliver them in its current mode.
func GPU(nodeName string, gpus []hw.GPU, f device.Features) resourceslice.DriverResources {
	return TaintedGPU(nodeName, gpus, nil, f, Health{})
}

// TaintedGPU is GPU with the GPUs bound to vfio-pci (passthrough devices)
// too and the devices that h finds at fault tainted (with DeviceTaints):
// the GPU's fault on every device of the GPU, a partition's on the
// devices at its placement.
func TaintedGPU(nodeName string, gpus []hw.GPU, passthrough []hw.PassthroughGPU, f device.Features, h Health) resourceslice.DriverResources {
	res, _ := buildGPUs(nodeName, gpus, passthrough, f, h, false)
	return res
}

// GPUDevice is what a published GPU device stands for on the hardware:
// prepare looks devices up here by name.
type GPUDevice struct {
	Kind string // KindGPU, KindMIG, KindVGPU or KindPassthrough
	// GPU is the NVML GPU of the first three kinds, Passthrough the
	// vfio-pci GPU of the last.
	GPU         hw.GPU
	Passthrough hw.PassthroughGPU
	// Profile and Placement: a MIG partition, or the GPU instance a
	// MIG-backed vGPU occupies.
	Profile   hw.MIGProfile
	Placement hw.Placement
	// VGPUType is set for vGPUs.
	VGPUType hw.VGPUType
	// Attributes are the device's published attributes (read only: they
	// share maps with other devices).
	Attributes map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
}

// PCIBusID is the address of the device's physical GPU.
func (d GPUDevice) PCIBusID() string {
	if d.Kind == device.KindPassthrough {
		return d.Passthrough.PCIBusID
	}
	return d.GPU.PCIBusID
}

// GPUDevices maps every device TaintedGPU publishes for these GPUs and
// features to what it stands for; both come from one builder.
func GPUDevices(gpus []hw.GPU, passthrough []hw.PassthroughGPU, f device.Features) map[string]GPUDevice {
	_, catalog := buildGPUs("", gpus, passthrough, f, Health{}, true)
	return catalog
}

func buildGPUs(nodeName string, gpus []hw.GPU, passthrough []hw.PassthroughGPU, f device.Features, h Health, withCatalog bool) (resourceslice.DriverResources, map[string]GPUDevice) {
	gpus = append([]hw.GPU(nil), gpus...)
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].PCIBusID < gpus[j].PCIBusID })

	cache := map[string]gpuBudget{}
	var (
		sets    []resourceapi.CounterSet
		devices []resourceapi.Device
		catalog map[string]GPUDevice
	)
	if withCatalog {
		catalog = map[string]GPUDevice{}
	}
	for _, g := range gpus {
		b := gpuDevices{gpu: g, f: f, health: h, budget: budgetFor(g, cache), set: device.GPUName(g.PCIBusID), catalog: catalog}
		b.build()
		if b.usesCounters {
			sets = append(sets, b.budget.counterSet(b.set, g.MIG.Profiles))
		}
		devices = append(devices, b.devices...)
	}
	devices = append(devices, passthroughDevices(passthrough, catalog)...)
	// No partitionTypeAttribute: the pool-status controller can summarise
	// no partition type of this model honestly (README, "Device model").
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		nodeName: pool(sets, devices),
	}}, catalog
}

// gpuDevices builds the devices of one GPU.
type gpuDevices struct {
	gpu          hw.GPU
	common       map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	f            device.Features
	health       Health
	budget       gpuBudget
	set          string
	devices      []resourceapi.Device
	catalog      map[string]GPUDevice // nil unless asked for
	usesCounters bool
}

func (b *gpuDevices) build() {
	g := b.gpu
	hostVGPU := g.Virtualization == hw.VirtualizationHostVGPU || g.Virtualization == hw.VirtualizationHostVSGA
	// MIG mode can change under us only where that needs no reset and no
	// instance exists; otherwise the current mode decides what is
	// deliverable.
	switchable := g.MIG.Capable && g.MIG.SwitchWithoutReset && len(g.MIG.Instances) == 0
	migOff := !g.MIG.Enabled || switchable
	migOn := g.MIG.Capable && (g.MIG.Enabled || switchable)

	if !b.f.PartitionableDevices {
		// Without counters only fixed devices are safe to offer.
		if !hostVGPU && !g.MIG.Enabled {
			b.add(b.full(false), GPUDevice{Kind: device.KindGPU})
		}
		for _, in := range g.MIG.Instances {
			if p, ok := g.MIG.Profile(in.ProfileID); ok {
				b.add(b.mig(p, in.Placement, false), GPUDevice{Kind: device.KindMIG, Profile: p, Placement: in.Placement})
			}
		}
		return
	}
	b.usesCounters = true
	if !hostVGPU && migOff {
		b.add(b.full(true), GPUDevice{Kind: device.KindGPU})
		b.addShare()
	}
	if migOn {
		for _, p := range g.MIG.Profiles {
			for _, pl := range b.freePlacements(p, true) {
				b.add(b.mig(p, pl, true), GPUDevice{Kind: device.KindMIG, Profile: p, Placement: pl})
			}
		}
	}
	if hostVGPU && b.f.CompatibilityGroups {
		for _, t := range creatableVGPUTypes(g.VGPU) {
			if t.GPUInstanceProfileID == nil {
				if migOff {
					for i := 0; i < t.MaxInstances; i++ {
						b.add(b.timeSlicedVGPU(t, i), GPUDevice{Kind: device.KindVGPU, VGPUType: t})
					}
				}
				continue
			}
			p, ok := g.MIG.Profile(*t.GPUInstanceProfileID)
			if !migOn || !ok {
				continue
			}
			for _, pl := range b.freePlacements(p, false) {
				b.add(b.migBackedVGPU(t, p, pl), GPUDevice{Kind: device.KindVGPU, VGPUType: t, Profile: p, Placement: pl})
			}
		}
	}
}

// creatableVGPUTypes are the vGPU types the GPU's framework can create
// (none where no framework is set up: NVML lists what the vGPU manager
// supports either way), each with at most as many instances as there are
// VFs to host them, one each. Across types the memory counter binds
// first: the vGPU manager enables as many VFs as the GPU can host vGPUs
// (an H100 has 32 VFs and hosts at most 20, of 4 GB each), so the cap
// matters only where fewer VFs are enabled, and there a prepare that
// finds no free VF says so.
func creatableVGPUTypes(v hw.VGPU) []hw.VGPUType {
	var out []hw.VGPUType
	for _, t := range v.Types {
		if !t.Creatable || v.Framework == "" {
			continue
		}
		if v.VFs > 0 {
			t.MaxInstances = min(t.MaxInstances, v.VFs)
		}
		out = append(out, t)
	}
	return out
}

// passthroughDevices are the GPUs bound to vfio-pci, each a whole GPU for
// a VM. They consume no counters: NVML, and so no other device, has them.
func passthroughDevices(gpus []hw.PassthroughGPU, catalog map[string]GPUDevice) []resourceapi.Device {
	out := make([]resourceapi.Device, 0, len(gpus))
	for _, g := range gpus {
		a := placeAttributes(g.PCIBusID, g.PCIeRoot, g.NUMANode)
		a[device.AttrType] = str(device.KindPassthrough)
		a[device.AttrProfile] = str(device.ProfilePassthrough)
		a[attrProductName] = str(g.ProductName)
		a[attrPCIDeviceID] = str(g.DeviceID)
		d := resourceapi.Device{Name: device.PassthroughName(g.PCIBusID), Attributes: a}
		out = append(out, d)
		if catalog != nil {
			catalog[d.Name] = GPUDevice{Kind: device.KindPassthrough, Passthrough: g, Attributes: a}
		}
	}
	return out
}

func (b *gpuDevices) add(d resourceapi.Device, what GPUDevice) {
	what.GPU = b.gpu
	if fault, ok := what.Fault(b.health.Faults); ok && b.f.DeviceTaints {
		d.Taints = []resourceapi.DeviceTaint{b.health.taint(device.GPUTaintKey, fault)}
	}
	b.devices = append(b.devices, d)
	if b.catalog != nil {
		what.Attributes = d.Attributes
		b.catalog[d.Name] = what
	}
}

// freePlacements are a profile's placements that no existing instance
// overlaps (or, with reuse, that an existing instance of that profile
// occupies exactly), last first: the allocator takes devices in order, and
// filling from the top keeps the low slices free for large profiles.
func (b *gpuDevices) freePlacements(p hw.MIGProfile, reuse bool) []hw.Placement {
	var out []hw.Placement
	for _, pl := range p.Placements {
		ok := true
		for _, in := range b.gpu.MIG.Instances {
			if in.Placement.Overlaps(pl) && !(reuse && in.ProfileID == p.ID && in.Placement == pl) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, pl)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start > out[j].Start })
	return out
}

func (b *gpuDevices) full(counters bool) resourceapi.Device {
	g := b.gpu
	d := b.base(device.GPUName(g.PCIBusID), device.KindGPU, device.ProfileFull)
	d.Attributes[device.AttrUUID] = str(g.UUID)
	d.Attributes[attrMIGCapable] = boolean(g.MIG.Capable)
	d.Capacity = capacity(g.MemoryBytes, smTotal(g))
	if counters {
		d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{
			CounterSet: b.set, Counters: b.budget.all(g.MIG.Profiles),
		}}
	}
	return d
}

func (b *gpuDevices) mig(p hw.MIGProfile, pl hw.Placement, counters bool) resourceapi.Device {
	d := b.base(device.MIGName(b.gpu.PCIBusID, p.Name, pl.Start), device.KindMIG, p.Name)
	d.Attributes[attrParentUUID] = str(b.gpu.UUID)
	d.Attributes[device.AttrPlacementStart] = integer(pl.Start)
	d.Attributes[device.AttrPlacementSize] = integer(pl.Size)
	d.Capacity = capacity(p.MemoryBytes, p.Multiprocessors)
	if counters {
		d.ConsumesCounters = b.consume(b.budget.migConsumption(p, pl), groupMIG)
	}
	return d
}

func (b *gpuDevices) timeSlicedVGPU(t hw.VGPUType, i int) resourceapi.Device {
	d := b.vgpu(t, i)
	group := groupVGPUTimeSlice
	if !b.gpu.VGPU.Heterogeneous {
		// One time-sliced type per GPU at a time: each type is its own group.
		group = device.Name("vgpu", device.ShortVGPUName(t.Name))
	}
	d.Capacity = capacity(t.FramebufferBytes, 0)
	d.ConsumesCounters = b.consume(map[string]resourceapi.Counter{counterMemory: bytesCounter(t.FramebufferBytes)}, group)
	return d
}

func (b *gpuDevices) migBackedVGPU(t hw.VGPUType, p hw.MIGProfile, pl hw.Placement) resourceapi.Device {
	d := b.vgpu(t, pl.Start)
	d.Attributes[attrMIGProfile] = str(p.Name)
	d.Attributes[device.AttrPlacementStart] = integer(pl.Start)
	d.Attributes[device.AttrPlacementSize] = integer(pl.Size)
	d.Capacity = capacity(t.FramebufferBytes, p.Multiprocessors)
	d.ConsumesCounters = b.consume(b.budget.migConsumption(p, pl), groupVGPUMIG)
	return d
}

func (b *gpuDevices) vgpu(t hw.VGPUType, index int) resourceapi.Device {
	d := b.base(device.VGPUName(b.gpu.PCIBusID, t.Name, index), device.KindVGPU, device.ShortVGPUName(t.Name))
	d.Attributes[attrParentUUID] = str(b.gpu.UUID)
	d.Attributes[attrVGPUType] = str(t.Name)
	d.Attributes[attrMIGBacked] = boolean(t.GPUInstanceProfileID != nil)
	d.Attributes[attrVGPUFramework] = str(string(b.gpu.VGPU.Framework))
	if t.Class != "" {
		d.Attributes[attrVGPUClass] = str(t.Class)
	}
	return d
}

func (b *gpuDevices) consume(counters map[string]resourceapi.Counter, group string) []resourceapi.DeviceCounterConsumption {
	c := resourceapi.DeviceCounterConsumption{CounterSet: b.set, Counters: counters}
	if b.f.CompatibilityGroups {
		c.CompatibilityGroups = []string{group}
	}
	return []resourceapi.DeviceCounterConsumption{c}
}

// base starts a device with the attributes every device of the GPU
// carries, so that constraints (matchAttribute on NUMA node or PCIe root)
// work across kinds. The shared attributes are built once per GPU: the
// values are read-only, so devices may share them.
func (b *gpuDevices) base(name, kind, profile string) resourceapi.Device {
	if b.common == nil {
		b.common = gpuAttributes(b.gpu)
	}
	a := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(b.common)+6)
	for k, v := range b.common {
		a[k] = v
	}
	a[device.AttrType] = str(kind)
	a[device.AttrProfile] = str(profile)
	return resourceapi.Device{Name: name, Attributes: a}
}

func gpuAttributes(g hw.GPU) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	a := placeAttributes(g.PCIBusID, g.PCIeRoot, g.NUMANode)
	a[attrProductName] = str(g.ProductName)
	a[attrArchitecture] = str(g.Architecture)
	for name, v := range map[resourceapi.QualifiedName]string{
		attrCUDACompute: g.CUDAComputeCapability,
		attrDriver:      g.DriverVersion,
		attrCUDADriver:  g.CUDADriverVersion,
	} {
		if s := semver(v); s != "" {
			a[name] = resourceapi.DeviceAttribute{VersionValue: &s}
		}
	}
	return a
}

// placeAttributes are the standard attributes of where a GPU sits (PCI
// address, PCIe root and NUMA node where known), which constraints match
// across kinds and drivers.
func placeAttributes(pciBusID, pcieRoot string, numa int) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		deviceattribute.StandardDeviceAttributePCIBusID: str(pciBusID),
	}
	if pcieRoot != "" {
		a[deviceattribute.StandardDeviceAttributePCIeRoot] = str(pcieRoot)
	}
	if numa >= 0 {
		a[deviceattribute.StandardDeviceAttributeNUMANode] = integer(numa)
	}
	return a
}

func smTotal(g hw.GPU) int {
	best := 0
	for _, p := range g.MIG.Profiles {
		best = max(best, p.Multiprocessors)
	}
	return best
}

func capacity(memory uint64, sms int) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	c := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		capMemory: {Value: *resource.NewQuantity(int64(memory), resource.BinarySI)},
	}
	if sms > 0 {
		c[capSMs] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(sms), resource.DecimalSI)}
	}
	return c
}

// semver turns NVIDIA's versions ("9.0", "12.4", "535.104.05") into the
// semantic versions the API requires ("9.0.0", "12.4.0", "535.104.5"):
// a missing patch is zero and leading zeros go. Unparseable gives "".
func semver(v string) string {
	parsed, err := version.ParseGeneric(v)
	if err != nil || len(parsed.Components()) > 3 {
		return ""
	}
	return fmt.Sprintf("%d.%d.%d", parsed.Major(), parsed.Minor(), parsed.Patch())
}
