// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"fmt"
	"sort"

	"github.com/hwdra/hwdra/internal/agent/slices/device"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"
)

// Compatibility groups: devices on one GPU are co-allocated only within a
// group, so MIG partitions and vGPUs never share a GPU. (Time-sliced types
// that the hardware cannot mix are kept apart by the framebuffer counter:
// see timeSlicedBlocks.)
const (
	groupMIG           = "mig"
	groupVGPUMIG       = "vgpu-mig"
	groupVGPUTimeSlice = "vgpu-timesliced"
)

// GPU builds the gpu.hwdra.io pool of a node: one counter set per
// GPU, and per GPU the whole GPU, its MIG partitions and its vGPU types, as
// far as the hardware can deliver them in its current mode.
func GPU(nodeName string, gpus []hw.GPU, f device.Features) resourceslice.DriverResources {
	return TaintedGPU(nodeName, gpus, nil, f, Health{}, config.GPUPolicy{})
}

// TaintedGPU is GPU with the GPUs bound to vfio-pci (passthrough devices)
// too, the devices that h finds at fault tainted (with DeviceTaints): the
// GPU's fault on every device of the GPU, a partition's on the devices at
// its placement; and without the MIG profiles that p leaves out, nor,
// where p leaves GPU settings alone, the devices that need a GPU's MIG
// mode switched.
func TaintedGPU(nodeName string, gpus []hw.GPU, passthrough []hw.PassthroughGPU, f device.Features, h Health, p config.GPUPolicy) resourceslice.DriverResources {
	res, _ := buildGPUs(nodeName, gpus, passthrough, f, h, p, false)
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
// features to what it stands for; both come from one builder. It includes
// the MIG profiles a configuration may leave out, and the devices that
// need a MIG mode switch that gpus.settings Leave leaves out: a claim
// allocated before the configuration changed is still found, and prepares
// or is refused with a reason.
func GPUDevices(gpus []hw.GPU, passthrough []hw.PassthroughGPU, f device.Features) map[string]GPUDevice {
	_, catalog := buildGPUs("", gpus, passthrough, f, Health{}, config.GPUPolicy{}, true)
	return catalog
}

func buildGPUs(nodeName string, gpus []hw.GPU, passthrough []hw.PassthroughGPU, f device.Features, h Health, p config.GPUPolicy, withCatalog bool) (resourceslice.DriverResources, map[string]GPUDevice) {
	gpus = append([]hw.GPU(nil), gpus...)
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].PCIBusID < gpus[j].PCIBusID })

	var (
		sets    []resourceapi.CounterSet
		devices []resourceapi.Device
		catalog map[string]GPUDevice
	)
	if withCatalog {
		catalog = map[string]GPUDevice{}
	}
	for _, g := range gpus {
		b := gpuDevices{gpu: g, f: f, health: h, policy: p, set: device.GPUName(g.PCIBusID), catalog: catalog}
		b.build()
		if b.usesCounters {
			sets = append(sets, b.counters.counterSet(b.set, g.MIG.Profiles))
		}
		devices = append(devices, b.devices...)
	}
	devices = append(devices, passthroughDevices(passthrough, catalog)...)
	// No partitionTypeAttribute: the pool-status controller can summarise
	// no partition type of this model honestly (docs/design.md, "Pool status and partition types").
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
	policy       config.GPUPolicy
	counters     gpuCounters
	set          string
	devices      []resourceapi.Device
	catalog      map[string]GPUDevice // nil unless asked for
	usesCounters bool
	// groups: the GPU offers vGPUs, whose compatibility groups keep them
	// apart from MIG partitions (and the GPU's other devices need groups
	// too). Without vGPUs no device of the GPU needs a group.
	groups bool
}

// plannedDevice is a device the GPU will publish, before its counters are
// known.
type plannedDevice struct {
	what GPUDevice
	// index: a time-sliced vGPU block's number.
	index int
	// instances: a time-sliced vGPU block's vGPUs; above 1 the block is
	// one device that many claims share.
	instances int
	// memory: the framebuffer a time-sliced vGPU block takes.
	memory uint64
}

func (b *gpuDevices) build() {
	g := b.gpu
	hostVGPU := g.Virtualization == hw.VirtualizationHostVGPU || g.Virtualization == hw.VirtualizationHostVSGA
	// MIG mode can change under us only where that needs no reset and no
	// instance exists, and where the agent may change it (gpus.settings
	// Manage); otherwise the current mode decides what is deliverable:
	// under Leave a GPU with MIG off offers no MIG partitions.
	switchable := g.MIG.Capable && g.MIG.SwitchWithoutReset && len(g.MIG.Instances) == 0 && b.policy.ManagesSettings()
	migOff := !g.MIG.Enabled || switchable
	migOn := g.MIG.Capable && (g.MIG.Enabled || switchable)

	if !b.f.PartitionableDevices {
		// Without counters only fixed devices are safe to offer.
		if !hostVGPU && !g.MIG.Enabled {
			b.add(b.full(false), GPUDevice{Kind: device.KindGPU})
		}
		for _, in := range g.MIG.Instances {
			if p, ok := g.MIG.Profile(in.ProfileID); ok && b.policy.OffersMIGProfile(p.Name) {
				b.add(b.mig(p, in.Placement, false), GPUDevice{Kind: device.KindMIG, Profile: p, Placement: in.Placement})
			}
		}
		return
	}
	var planned []plannedDevice
	if !hostVGPU && migOff {
		planned = append(planned, plannedDevice{what: GPUDevice{Kind: device.KindGPU}})
		if b.shareable() {
			planned = append(planned, plannedDevice{what: GPUDevice{Kind: device.KindShare}})
		}
	}
	if migOn {
		for _, p := range g.MIG.Profiles {
			if !b.policy.OffersMIGProfile(p.Name) {
				continue
			}
			for _, pl := range b.offeredPlacements(p, true) {
				planned = append(planned, plannedDevice{what: GPUDevice{Kind: device.KindMIG, Profile: p, Placement: pl}})
			}
		}
	}
	if hostVGPU && b.f.CompatibilityGroups {
		types := creatableVGPUTypes(g.VGPU)
		b.groups = len(types) > 0
		for _, t := range types {
			if t.GPUInstanceProfileID == nil {
				if migOff {
					planned = append(planned, b.timeSlicedBlocks(t)...)
				}
				continue
			}
			p, ok := g.MIG.Profile(*t.GPUInstanceProfileID)
			if !migOn || !ok {
				continue
			}
			for _, pl := range b.offeredPlacements(p, false) {
				planned = append(planned, plannedDevice{what: GPUDevice{Kind: device.KindVGPU, VGPUType: t, Profile: p, Placement: pl}})
			}
		}
	}
	b.counters = countersFor(g, planned)
	interleave(planned)
	// A whole GPU with nothing to keep out needs no counters at all.
	b.usesCounters = len(planned) > 1 || len(planned) == 1 && planned[0].what.Kind != device.KindGPU
	for _, p := range planned {
		var d resourceapi.Device
		switch {
		case p.what.Kind == device.KindGPU:
			d = b.full(b.usesCounters)
		case p.what.Kind == device.KindShare:
			d = b.share()
		case p.what.Kind == device.KindMIG:
			d = b.mig(p.what.Profile, p.what.Placement, true)
		case p.what.Placement.Size > 0:
			d = b.migBackedVGPU(p.what.VGPUType, p.what.Profile, p.what.Placement)
		default:
			d = b.timeSlicedVGPU(p)
		}
		b.add(d, p.what)
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
		a[device.AttrProductName] = str(g.ProductName)
		a[device.AttrPCIDeviceID] = str(g.DeviceID)
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

// interleave orders a GPU's devices by their rank within their profile or
// vGPU type (the whole GPU, then each profile's first placement, then each
// one's second, ...), keeping the order of devices of one profile. The
// allocator evaluates a claim's selectors on every device before the first
// that matches, so a claim for any profile now meets one of its devices
// within the first dozen of a GPU rather than after every placement of
// the profiles before it (a 3g.40gb came after 17 devices of an H100). A
// profile's devices keep their order, so first-fit picks the same
// placements as before.
func interleave(planned []plannedDevice) {
	type ranked struct {
		rank int
		p    plannedDevice
	}
	seen := map[string]int{}
	list := make([]ranked, len(planned))
	for i, p := range planned {
		key := p.what.Kind + "/" + p.what.Profile.Name + "/" + p.what.VGPUType.Name
		list[i] = ranked{seen[key], p}
		seen[key]++
	}
	sort.SliceStable(list, func(a, b int) bool { return list[a].rank < list[b].rank })
	for i := range list {
		planned[i] = list[i].p
	}
}

// offeredPlacements are a profile's placements that no existing instance
// overlaps (or, with reuse, that an existing instance of that profile
// occupies exactly), last first: the allocator takes devices in order, and
// filling from the top keeps the low slices free for large profiles.
//
// Where the instance count rather than the placements limits a profile
// (one "+me" instance, seven 1-slice placements), each placement would be
// another interchangeable device to the allocator, which tries every
// combination of them before it refuses a claim for one more instance
// than the GPUs hold. Such a profile is offered at its highest free
// placement(s) in each half of the GPU (and where an instance of it
// exists): two devices instead of seven per instance. On an H100 that
// loses one layout of the 50 with a 1g.10gb+me (4g.40gb, 1g.20gb,
// 1g.10gb and the +me at slice 5); the lowest placements would lose two.
func (b *gpuDevices) offeredPlacements(p hw.MIGProfile, reuse bool) []hw.Placement {
	var free, existing []hw.Placement
	for _, pl := range p.Placements {
		ok := true
		for _, in := range b.gpu.MIG.Instances {
			if in.Placement.Overlaps(pl) {
				if reuse && in.ProfileID == p.ID && in.Placement == pl {
					existing = append(existing, pl)
				}
				ok = false
				break
			}
		}
		if ok {
			free = append(free, pl)
		}
	}
	out := append(existing, free...)
	if p.InstanceCount > 0 && maxDisjoint(out) > p.InstanceCount {
		out = append(existing, highestPerHalf(free, p.InstanceCount-len(existing), b.gpu.MIG.MemorySlices)...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start > out[j].Start })
	return out
}

// highestPerHalf picks, in each half of a GPU's memory slices, the
// highest n placements that do not overlap each other.
func highestPerHalf(placements []hw.Placement, n, slices int) []hw.Placement {
	var out []hw.Placement
	if n <= 0 {
		return out
	}
	for _, upper := range []bool{false, true} {
		var used uint64
		taken := 0
		for i := len(placements) - 1; i >= 0; i-- { // NVML lists them ascending
			pl := placements[i]
			if (pl.Start >= slices/2) != upper || used&placementMask(pl) != 0 || taken == n {
				continue
			}
			used |= placementMask(pl)
			taken++
			out = append(out, pl)
		}
	}
	return out
}

// timeSlicedBlocks are the devices of a time-sliced vGPU type. Its vGPUs
// are interchangeable, so they are published as blocks that claims share
// (allowMultipleAllocations), each share one vGPU (prepare creates it),
// rather than one device per vGPU: a claim for one more vGPU than a GPU
// holds then costs the allocator one device per block to refuse, not
// every subset of the vGPUs. A block takes its framebuffer from the GPU's
// counters once, at its first share.
//
// Where the GPU runs one time-sliced type at a time, one block holds all
// of a type's vGPUs and takes all of the framebuffer. Where sizes mix
// (heterogeneous mode), a type whose vGPUs split evenly between the two
// halves of the framebuffer gets one block per half, so two types can
// share a GPU; another (H100-16C: five of 16 GiB) gets one block for the
// whole GPU.
func (b *gpuDevices) timeSlicedBlocks(t hw.VGPUType) []plannedDevice {
	mem := max(b.gpu.MemoryBytes, t.FramebufferBytes*uint64(t.MaxInstances))
	what := GPUDevice{Kind: device.KindVGPU, VGPUType: t}
	if t.MaxInstances <= 0 || t.FramebufferBytes == 0 {
		return nil
	}
	half := mem / 2
	perHalf := int(half / t.FramebufferBytes)
	if !b.gpu.VGPU.Heterogeneous || perHalf == 0 || 2*perHalf < t.MaxInstances {
		return []plannedDevice{{what: what, instances: t.MaxInstances, memory: mem}}
	}
	// Fewer instances than fit (the VFs cap them) split evenly.
	first := min(perHalf, (t.MaxInstances+1)/2)
	blocks := []plannedDevice{{what: what, index: 0, instances: first, memory: half}}
	if rest := t.MaxInstances - first; rest > 0 {
		blocks = append(blocks, plannedDevice{what: what, index: 1, instances: rest, memory: mem - half})
	}
	return blocks
}

func (b *gpuDevices) full(counters bool) resourceapi.Device {
	g := b.gpu
	d := b.base(device.GPUName(g.PCIBusID), device.KindGPU, device.ProfileFull)
	d.Attributes[device.AttrUUID] = str(g.UUID)
	d.Attributes[device.AttrMIGCapable] = boolean(g.MIG.Capable)
	d.Capacity = capacity(g.MemoryBytes, smTotal(g))
	if counters {
		d.ConsumesCounters = b.consume(b.counters.wholeGPU(), "")
	}
	return d
}

func (b *gpuDevices) mig(p hw.MIGProfile, pl hw.Placement, counters bool) resourceapi.Device {
	d := b.base(device.MIGName(b.gpu.PCIBusID, p.Name, pl.Start), device.KindMIG, p.Name)
	d.Attributes[device.AttrParentUUID] = str(b.gpu.UUID)
	d.Attributes[device.AttrPlacementStart] = integer(pl.Start)
	d.Attributes[device.AttrPlacementSize] = integer(pl.Size)
	d.Capacity = capacity(p.MemoryBytes, p.Multiprocessors)
	if counters {
		d.ConsumesCounters = b.consume(b.counters.placement(p, pl), groupMIG)
	}
	return d
}

// timeSlicedVGPU is a block of time-sliced vGPUs: a device of its own
// where it holds one, else one that claims share, each share one vGPU
// (capacity instances) and its framebuffer (capacity memory).
func (b *gpuDevices) timeSlicedVGPU(p plannedDevice) resourceapi.Device {
	t := p.what.VGPUType
	d := b.vgpu(t, p.index)
	d.Capacity = capacity(t.FramebufferBytes, 0)
	if p.instances > 1 {
		d.AllowMultipleAllocations = new(true)
		one := resource.NewQuantity(1, resource.DecimalSI)
		fb := resource.NewQuantity(int64(t.FramebufferBytes), resource.BinarySI)
		d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			device.GPUCapInstances: {
				Value:         *resource.NewQuantity(int64(p.instances), resource.DecimalSI),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: one, ValidValues: []resource.Quantity{*one}},
			},
			device.GPUCapMemory: {
				Value:         *resource.NewQuantity(int64(t.FramebufferBytes)*int64(p.instances), resource.BinarySI),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: fb, ValidValues: []resource.Quantity{*fb}},
			},
		}
	}
	use := map[string]resourceapi.Counter{device.CounterMemory: bytesCounter(p.memory)}
	if b.counters.vfs > 0 {
		use[device.CounterVFs] = intCounter(p.instances) // all of the block's, at its first share
	}
	d.ConsumesCounters = b.consume(use, groupVGPUTimeSlice)
	return d
}

func (b *gpuDevices) migBackedVGPU(t hw.VGPUType, p hw.MIGProfile, pl hw.Placement) resourceapi.Device {
	d := b.vgpu(t, pl.Start)
	d.Attributes[device.AttrMIGProfile] = str(p.Name)
	d.Attributes[device.AttrPlacementStart] = integer(pl.Start)
	d.Attributes[device.AttrPlacementSize] = integer(pl.Size)
	d.Capacity = capacity(t.FramebufferBytes, p.Multiprocessors)
	use := b.counters.placement(p, pl)
	if b.counters.vfs > 0 {
		use[device.CounterVFs] = intCounter(1)
	}
	d.ConsumesCounters = b.consume(use, groupVGPUMIG)
	return d
}

func (b *gpuDevices) vgpu(t hw.VGPUType, index int) resourceapi.Device {
	d := b.base(device.VGPUName(b.gpu.PCIBusID, t.Name, index), device.KindVGPU, device.ShortVGPUName(t.Name))
	d.Attributes[device.AttrParentUUID] = str(b.gpu.UUID)
	d.Attributes[device.AttrVGPUType] = str(t.Name)
	d.Attributes[device.AttrMIGBacked] = boolean(t.GPUInstanceProfileID != nil)
	d.Attributes[device.AttrVGPUFramework] = str(string(b.gpu.VGPU.Framework))
	if t.Class != "" {
		d.Attributes[device.AttrVGPUClass] = str(t.Class)
	}
	return d
}

// consume is a device's consumption of its GPU's counter set, in a
// compatibility group where the GPU needs groups; the whole GPU (group "")
// is never published beside vGPUs.
func (b *gpuDevices) consume(counters map[string]resourceapi.Counter, group string) []resourceapi.DeviceCounterConsumption {
	c := resourceapi.DeviceCounterConsumption{CounterSet: b.set, Counters: counters}
	if b.groups && group != "" {
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
	a[device.AttrProductName] = str(g.ProductName)
	a[device.AttrArchitecture] = str(g.Architecture)
	for name, v := range map[resourceapi.QualifiedName]string{
		device.AttrCUDAComputeCapability: g.CUDAComputeCapability,
		device.AttrDriverVersion:         g.DriverVersion,
		device.AttrCUDADriverVersion:     g.CUDADriverVersion,
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
		device.GPUCapMemory: {Value: *resource.NewQuantity(int64(memory), resource.BinarySI)},
	}
	if sms > 0 {
		c[device.GPUCapMultiprocessors] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(sms), resource.DecimalSI)}
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
