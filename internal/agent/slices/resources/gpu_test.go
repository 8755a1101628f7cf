// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/slices/device"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/internal/hw"
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// checkLimits asserts every API limit the server would enforce per slice.
func checkLimits(t *testing.T, res resourceslice.DriverResources) {
	t.Helper()
	for poolName, p := range res.Pools {
		devices := map[string]bool{}
		sets := map[string]resourceapi.CounterSet{}
		for i, s := range p.Slices {
			if len(s.Devices) > 0 && len(s.SharedCounters) > 0 {
				t.Errorf("pool %s slice %d mixes devices and counters", poolName, i)
			}
			// No device of ours costs the same as another in its pool, so
			// a partition type would earn the pool a PartitionCostMismatch
			// from the pool-status controller (docs/design.md, "Pool status and partition types").
			if s.PartitionTypeAttribute != nil {
				t.Errorf("pool %s slice %d declares partitionTypeAttribute %s", poolName, i, *s.PartitionTypeAttribute)
			}
			if len(s.SharedCounters) > resourceapi.ResourceSliceMaxCounterSets {
				t.Errorf("slice %d: %d counter sets", i, len(s.SharedCounters))
			}
			for _, cs := range s.SharedCounters {
				sets[cs.Name] = cs
				if !dnsLabel.MatchString(cs.Name) || len(cs.Counters) > resourceapi.ResourceSliceMaxCountersPerCounterSet {
					t.Errorf("counter set %q: bad name or %d counters", cs.Name, len(cs.Counters))
				}
				for c := range cs.Counters {
					if !dnsLabel.MatchString(c) {
						t.Errorf("counter name %q is not a DNS label", c)
					}
				}
			}
			limit := resourceapi.ResourceSliceMaxDevices
			for _, d := range s.Devices {
				if len(d.ConsumesCounters) > 0 || len(d.Taints) > 0 {
					limit = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
				}
			}
			if len(s.Devices) > limit {
				t.Errorf("slice %d: %d devices, limit %d", i, len(s.Devices), limit)
			}
			for _, d := range s.Devices {
				if devices[d.Name] {
					t.Errorf("duplicate device %s", d.Name)
				}
				devices[d.Name] = true
				if !dnsLabel.MatchString(d.Name) {
					t.Errorf("device name %q is not a DNS label", d.Name)
				}
				if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
					t.Errorf("%s: %d attributes+capacities", d.Name, n)
				}
				if len(d.ConsumesCounters) > resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice {
					t.Errorf("%s: %d counter consumptions", d.Name, len(d.ConsumesCounters))
				}
				for _, a := range d.Attributes {
					if a.StringValue != nil && len(*a.StringValue) > resourceapi.DeviceAttributeMaxValueLength {
						t.Errorf("%s: attribute value %q too long", d.Name, *a.StringValue)
					}
				}
				for _, c := range d.ConsumesCounters {
					if len(c.CompatibilityGroups) > resourceapi.DeviceCompatibilityGroupsMaxSize {
						t.Errorf("%s: %d compatibility groups", d.Name, len(c.CompatibilityGroups))
					}
					cs, ok := sets[c.CounterSet]
					if !ok {
						t.Errorf("%s consumes from unknown or later counter set %s", d.Name, c.CounterSet)
					}
					for name := range c.Counters {
						if _, ok := cs.Counters[name]; !ok {
							t.Errorf("%s consumes unknown counter %s/%s", d.Name, c.CounterSet, name)
						}
					}
				}
			}
		}
	}
}

func deviceCount(res resourceslice.DriverResources) (devices, slices int) {
	for _, p := range res.Pools {
		slices += len(p.Slices)
		for _, s := range p.Slices {
			devices += len(s.Devices)
		}
	}
	return
}

func TestLimitsOnLargeNodes(t *testing.T) {
	vgpu := []hw.GPU{}
	for _, g := range dgx(8) {
		vgpu = append(vgpu, h100VGPU(g.PCIBusID))
	}
	for name, gpus := range map[string][]hw.GPU{"dgx 8xH100": dgx(8), "16 GPUs": dgx(16), "8 vGPU hosts": vgpu} {
		t.Run(name, func(t *testing.T) {
			res := GPU(testNode, gpus, device.AllFeatures)
			checkLimits(t, res)
			devices, slices := deviceCount(res)
			// Per H100: 1 full, its shares + 7+3+2+1+1+4 MIG placements,
			// and the one 1g.10gb+me at two.
			if name != "8 vGPU hosts" && devices != len(gpus)*22 {
				t.Errorf("%d devices for %d GPUs, want %d", devices, len(gpus), len(gpus)*22)
			}
			if slices < 1+(devices+63)/64 { // counter sets, then 64 devices a slice
				t.Errorf("%d devices in only %d slices", devices, slices)
			}
			t.Logf("%d devices in %d slices", devices, slices)
		})
	}
}

func TestDeterministic(t *testing.T) {
	gpus := dgx(8)
	want, _ := json.Marshal(Objects(device.GPUDriver, testNode, GPU(testNode, gpus, device.AllFeatures)))
	for i := 0; i < 5; i++ {
		shuffled := append([]hw.GPU(nil), gpus...)
		rand.Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		got, _ := json.Marshal(Objects(device.GPUDriver, testNode, GPU(testNode, shuffled, device.AllFeatures)))
		if string(got) != string(want) {
			t.Fatal("output differs between runs or input orders")
		}
	}
}

func names(res resourceslice.DriverResources) map[string]resourceapi.Device {
	return devicesByName(res)
}

func TestDeliverableDevicesOnly(t *testing.T) {
	a100MIG := h100("0000:1b:00.0", 0)
	a100MIG.MIG.Enabled, a100MIG.MIG.SwitchWithoutReset = true, false
	a100Off := a100MIG
	a100Off.MIG.Enabled = false

	withInstance := h100("0000:1b:00.0", 0)
	withInstance.MIG.Enabled = true
	withInstance.MIG.Instances = []hw.GPUInstance{{ID: 1, ProfileID: 2, Placement: hw.Placement{Start: 4, Size: 4}}}

	noMIG := h100("0000:1b:00.0", 0)
	noMIG.MIG = hw.MIG{}

	bus := "0000:1b:00.0"
	cases := []struct {
		name       string
		gpu        hw.GPU
		f          device.Features
		present    []string
		absent     []string
		wantCount  int
		noCounters bool
	}{
		{name: "MIG on, needs reset to switch", gpu: a100MIG, f: device.AllFeatures,
			present: []string{device.MIGName(bus, "1g.10gb", 0)}, absent: []string{device.GPUName(bus)}, wantCount: 20},
		{name: "MIG off, needs reset to switch", gpu: a100Off, f: device.AllFeatures,
			present: []string{device.GPUName(bus), device.ShareName(bus)}, absent: []string{device.MIGName(bus, "1g.10gb", 0)}, wantCount: 2},
		{name: "existing 3g instance", gpu: withInstance, f: device.AllFeatures,
			present: []string{device.MIGName(bus, "3g.40gb", 4), device.MIGName(bus, "3g.40gb", 0), device.MIGName(bus, "4g.40gb", 0), device.MIGName(bus, "1g.10gb", 3)},
			absent:  []string{device.GPUName(bus), device.ShareName(bus), device.MIGName(bus, "1g.10gb", 4), device.MIGName(bus, "7g.80gb", 0), device.MIGName(bus, "1g.20gb", 4)}},
		{name: "no MIG support", gpu: noMIG, f: device.AllFeatures, present: []string{device.GPUName(bus), device.ShareName(bus)}, wantCount: 2},
		{name: "no consumable capacity: no shares", gpu: noMIG, f: device.Features{PartitionableDevices: true, CompatibilityGroups: true, DeviceTaints: true},
			present: []string{device.GPUName(bus)}, absent: []string{device.ShareName(bus)}, wantCount: 1},
		{name: "no partitionable devices: full only", gpu: h100(bus, 0), f: device.Features{CompatibilityGroups: true, ConsumableCapacity: true},
			present: []string{device.GPUName(bus)}, absent: []string{device.ShareName(bus)}, wantCount: 1, noCounters: true},
		{name: "no partitionable devices: existing instances only", gpu: withInstance, f: device.Features{},
			present: []string{device.MIGName(bus, "3g.40gb", 4)}, wantCount: 1, noCounters: true},
		{name: "no compatibility groups: no vGPU", gpu: h100VGPU(bus), f: device.Features{PartitionableDevices: true},
			present: []string{device.MIGName(bus, "1g.10gb", 0)}, absent: []string{device.VGPUName(bus, "NVIDIA H100-20C", 0)}, wantCount: 20},
		{name: "vGPU host", gpu: h100VGPU(bus), f: device.AllFeatures,
			present: []string{device.VGPUName(bus, "NVIDIA H100-20C", 0), device.VGPUName(bus, "NVIDIA H100-1-10C", 6), device.MIGName(bus, "1g.10gb", 0)},
			absent:  []string{device.GPUName(bus), device.ShareName(bus), device.VGPUName(bus, "NVIDIA H100-20C", 1)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := GPU(testNode, []hw.GPU{tc.gpu}, tc.f)
			checkLimits(t, res)
			got := names(res)
			for _, n := range tc.present {
				if _, ok := got[n]; !ok {
					t.Errorf("missing %s", n)
				}
			}
			for _, n := range tc.absent {
				if _, ok := got[n]; ok {
					t.Errorf("unexpected %s", n)
				}
			}
			if tc.wantCount > 0 && len(got) != tc.wantCount {
				t.Errorf("%d devices, want %d", len(got), tc.wantCount)
			}
			for _, d := range got {
				if tc.noCounters && len(d.ConsumesCounters) > 0 {
					t.Errorf("%s consumes counters without the feature", d.Name)
				}
				for _, c := range d.ConsumesCounters {
					if !tc.f.CompatibilityGroups && len(c.CompatibilityGroups) > 0 {
						t.Errorf("%s has compatibility groups without the feature", d.Name)
					}
				}
			}
		})
	}
}

// TestCountersOfAnH100: the counter set holds what decides something: the
// memory slices (slice 7 only ever goes with slice 6, so it needs no
// counter) and the instance count of 1g.10gb+me (one instance, offered at
// two placements); engines and memory limit nothing the slices and counts
// do not.
func TestCountersOfAnH100(t *testing.T) {
	res := GPU(testNode, []hw.GPU{h100("0000:1b:00.0", 0)}, device.AllFeatures)
	cs := res.Pools[testNode].Slices[0].SharedCounters
	if len(cs) != 1 || cs[0].Name != "gpu-0000-1b-00-0" {
		t.Fatalf("counter sets %+v", cs)
	}
	want := map[string]string{"instances-1g-10gb-plus-me": "1"}
	for s := range 7 {
		want[fmt.Sprintf("memory-slice-%d", s)] = "1"
	}
	got := map[string]string{}
	for name, c := range cs[0].Counters {
		got[name] = c.Value.String()
	}
	if !maps.Equal(got, want) {
		t.Errorf("counters %v, want %v", got, want)
	}
	byName := names(res)
	for name, want := range map[string][]string{
		device.MIGName("0000:1b:00.0", "3g.40gb", 4):    {"memory-slice-4", "memory-slice-5", "memory-slice-6"},
		device.MIGName("0000:1b:00.0", "1g.20gb", 6):    {"memory-slice-6"},
		device.MIGName("0000:1b:00.0", "1g.10gb+me", 3): {"instances-1g-10gb-plus-me", "memory-slice-3"},
		device.GPUName("0000:1b:00.0"):                  slices.Sorted(maps.Keys(want))[1:],
	} {
		d, ok := byName[name]
		if !ok {
			t.Errorf("no device %s", name)
			continue
		}
		if got := slices.Sorted(maps.Keys(d.ConsumesCounters[0].Counters)); !slices.Equal(got, want) {
			t.Errorf("%s consumes %v, want %v", name, got, want)
		}
		if len(d.ConsumesCounters[0].CompatibilityGroups) > 0 {
			t.Errorf("%s has compatibility groups on a GPU without vGPUs", name)
		}
	}
	if got := byName[device.MIGName("0000:1b:00.0", "3g.40gb", 4)].Attributes[device.AttrProfile]; *got.StringValue != "3g.40gb" {
		t.Errorf("profile attribute %q", *got.StringValue)
	}
}

func TestSemver(t *testing.T) {
	for in, want := range map[string]string{"9.0": "9.0.0", "12.4": "12.4.0", "535.104.05": "535.104.5", "550.54.15": "550.54.15", "": "", "r535": "", "1.2.3.4": ""} {
		if got := semver(in); got != want {
			t.Errorf("semver(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLongNamesStayUniqueLabels(t *testing.T) {
	a := device.VGPUName("0000:1b:00.0", "NVIDIA GRID RTX8000P-48Q-with-an-absurdly-long-type-name-A", 1)
	b := device.VGPUName("0000:1b:00.0", "NVIDIA GRID RTX8000P-48Q-with-an-absurdly-long-type-name-B", 1)
	if a == b || !dnsLabel.MatchString(a) || !dnsLabel.MatchString(b) {
		t.Fatalf("long names %q and %q", a, b)
	}
}

func TestGPUDevicesMatchPublishedDevices(t *testing.T) {
	gpus := append(dgx(2), h100VGPU("0000:f0:00.0"))
	published := names(GPU(testNode, gpus, device.AllFeatures))
	catalog := GPUDevices(gpus, nil, device.AllFeatures)
	if len(catalog) != len(published) {
		t.Fatalf("catalog has %d devices, slices %d", len(catalog), len(published))
	}
	for name, d := range published {
		what, ok := catalog[name]
		if !ok {
			t.Fatalf("%s published but not in the catalog", name)
		}
		if kind := *d.Attributes[device.AttrType].StringValue; kind != what.Kind {
			t.Errorf("%s: kind %s in slices, %s in catalog", name, kind, what.Kind)
		}
		if what.GPU.PCIBusID != *d.Attributes["resource.kubernetes.io/pciBusID"].StringValue {
			t.Errorf("%s: catalog GPU %s", name, what.GPU.PCIBusID)
		}
		if what.Kind == device.KindMIG && device.MIGName(what.GPU.PCIBusID, what.Profile.Name, what.Placement.Start) != name {
			t.Errorf("%s: catalog says %s at %d", name, what.Profile.Name, what.Placement.Start)
		}
	}
}

func TestPoolRefusesDuplicateNames(t *testing.T) {
	d := func(name string) resourceapi.Device { return resourceapi.Device{Name: name} }
	p := pool(nil, []resourceapi.Device{d("a"), d("b"), d("a")})
	var names []string
	for _, s := range p.Slices {
		for _, dev := range s.Devices {
			names = append(names, dev.Name)
		}
	}
	if strings.Join(names, ",") != "a,b" {
		t.Fatalf("devices %v, want a,b", names)
	}
}

// TestMIGProfilesLeftOut: an AgentConfig's gpus.migProfiles leaves
// profiles out of the slices, the counters shrink to what the rest need,
// and the catalog prepare reads keeps them (a claim allocated before the
// change still prepares).
func TestMIGProfilesLeftOut(t *testing.T) {
	cfg, err := config.Parse([]byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\ngpus:\n  migProfiles:\n    include: [1g.10gb, 3g.40gb]\n"))
	if err != nil {
		t.Fatal(err)
	}
	gpus := dgx(2)
	res, _ := ForNode(testNode, hw.Inventory{GPUs: gpus}, cfg, device.AllFeatures, hw.Health{})
	checkLimits(t, res[device.GPUDriver])
	published := names(res[device.GPUDriver])
	profiles := map[string]int{}
	for _, d := range published {
		profiles[*d.Attributes[device.AttrProfile].StringValue]++
	}
	if want := map[string]int{device.ProfileFull: 2, device.ProfileShare: 2, "1g.10gb": 14, "3g.40gb": 4}; !maps.Equal(profiles, want) {
		t.Errorf("devices per profile %v, want %v", profiles, want)
	}
	if cs := res[device.GPUDriver].Pools[testNode].Slices[0].SharedCounters[0]; len(cs.Counters) != 7 {
		t.Errorf("counters %v: want memory slices 0-6 only", slices.Sorted(maps.Keys(cs.Counters)))
	}
	catalog := GPUDevices(gpus, nil, device.AllFeatures)
	for name := range published {
		if _, ok := catalog[name]; !ok {
			t.Errorf("%s published but not in the catalog", name)
		}
	}
	if _, ok := catalog[device.MIGName(gpus[0].PCIBusID, "2g.20gb", 0)]; !ok {
		t.Error("the catalog lost a left-out profile")
	}
}

// TestSettingsLeave: with gpus.settings Leave the agent switches no MIG
// mode, so a GPU with MIG off offers its whole GPU and its share device
// and no MIG partition, a GPU with MIG on its MIG partitions (and, as
// without the setting, no whole GPU or share: those need MIG off), and a
// vGPU host with MIG off its time-sliced types and no MIG-backed one. The
// catalog prepare reads still has the left-out partitions, for a claim
// allocated before the setting changed to be refused with a reason.
func TestSettingsLeave(t *testing.T) {
	leave, err := config.Parse([]byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\ngpus: {settings: Leave}\n"))
	if err != nil {
		t.Fatal(err)
	}
	off, on := h100("0000:1b:00.0", 0), h100("0000:2b:00.0", 0)
	on.MIG.Enabled, on.MIG.Pending = true, true
	host := h100VGPU("0000:3b:00.0")
	gpus := []hw.GPU{off, on, host}
	kinds := func(cfg *config.AgentConfig) map[string]map[string]int {
		res, _ := ForNode(testNode, hw.Inventory{GPUs: gpus}, cfg, device.AllFeatures, hw.Health{})
		checkLimits(t, res[device.GPUDriver])
		out := map[string]map[string]int{}
		for _, d := range names(res[device.GPUDriver]) {
			bus := *d.Attributes["resource.kubernetes.io/pciBusID"].StringValue
			if out[bus] == nil {
				out[bus] = map[string]int{}
			}
			out[bus][*d.Attributes[device.AttrType].StringValue]++
		}
		return out
	}
	got := kinds(leave)
	want := map[string]map[string]int{
		off.PCIBusID:  {device.KindGPU: 1, device.KindShare: 1},
		on.PCIBusID:   {device.KindMIG: 20},
		host.PCIBusID: {device.KindVGPU: 3}, // H100-80C, -40C, -20C: one block each
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("devices by GPU and kind under Leave:\n got %v\nwant %v", got, want)
	}
	// Under Manage (the default) the switchable GPUs offer both modes.
	managed := kinds(config.Default())
	if managed[off.PCIBusID][device.KindMIG] != 20 || managed[on.PCIBusID][device.KindGPU] != 1 || managed[host.PCIBusID][device.KindVGPU] <= 3 {
		t.Errorf("devices by GPU and kind under Manage: %v", managed)
	}
	catalog := GPUDevices(gpus, nil, device.AllFeatures)
	if _, ok := catalog[device.MIGName(off.PCIBusID, "1g.10gb", 6)]; !ok {
		t.Error("the catalog lost the MIG partitions of the GPU with MIG off")
	}
}

// TestEveryKindNearTheFront: the allocator evaluates a claim's selectors on
// every device before the first match, so each GPU lists one device of
// every profile and vGPU type before a second of any (interleave), while
// each profile's placements keep their order (last first).
func TestEveryKindNearTheFront(t *testing.T) {
	for _, gpus := range [][]hw.GPU{dgx(2), {h100VGPU("0000:1b:00.0")}} {
		res := GPU(testNode, gpus, device.AllFeatures)
		var order []resourceapi.Device
		for _, s := range res.Pools[testNode].Slices {
			order = append(order, s.Devices...)
		}
		kindOf := func(d resourceapi.Device) string {
			return *d.Attributes["resource.kubernetes.io/pciBusID"].StringValue + "/" + *d.Attributes[device.AttrProfile].StringValue
		}
		kinds := map[string]bool{}
		for _, d := range order {
			kinds[kindOf(d)] = true
		}
		firsts := map[string]bool{}
		lastStart := map[string]int64{}
		for i, d := range order {
			k := kindOf(d)
			bus, _, _ := strings.Cut(k, "/")
			if a, ok := d.Attributes[device.AttrPlacementStart]; ok {
				if last, seen := lastStart[k]; seen && *a.IntValue > last {
					t.Errorf("%s: placement %d after %d", k, *a.IntValue, last)
				}
				lastStart[k] = *a.IntValue
			}
			if !firsts[k] {
				firsts[k] = true
				continue
			}
			for other := range kinds {
				if strings.HasPrefix(other, bus+"/") && !firsts[other] {
					t.Errorf("device %d (%s) is a second %s before the first %s", i, d.Name, k, other)
				}
			}
		}
	}
}

// TestCreatableVGPUTypes: only what the GPU's vGPU framework can create is
// published: nothing without a framework, only types it offers, and no
// more instances of a type than there are VFs to host them.
func TestCreatableVGPUTypes(t *testing.T) {
	g := h100VGPU("0000:1b:00.0")
	// count is the vGPUs published per type: a device each, or a block's
	// instances.
	count := func(g hw.GPU) map[string]int {
		out := map[string]int{}
		for _, d := range devicesByName(GPU(testNode, []hw.GPU{g}, device.AllFeatures)) {
			if *d.Attributes[device.AttrType].StringValue != device.KindVGPU {
				continue
			}
			n := 1
			if c, ok := d.Capacity[device.GPUCapInstances]; ok {
				n = int(c.Value.Value())
			}
			out[*d.Attributes[device.AttrProfile].StringValue] += n
		}
		return out
	}
	if got := count(g); got["H100-20C"] != 4 || got["H100-1-10C"] != 7 {
		t.Fatalf("mdev framework, 16 VFs: %v", got)
	}
	none := g
	none.VGPU.Framework = ""
	if got := count(none); len(got) != 0 {
		t.Errorf("no framework: %v", got)
	}
	few := g
	few.VGPU.VFs = 2
	if got := count(few); got["H100-20C"] != 2 || got["H100-40C"] != 2 || got["H100-80C"] != 1 {
		t.Errorf("2 VFs: %v", got)
	}
	partial := g
	partial.VGPU.Types = append([]hw.VGPUType(nil), g.VGPU.Types...)
	partial.VGPU.Types[2].Creatable = false // no mdev type directory for H100-20C
	if got := count(partial); got["H100-20C"] != 0 || got["H100-40C"] != 2 {
		t.Errorf("H100-20C not offered by the framework: %v", got)
	}
}
