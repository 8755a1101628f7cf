// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package poolstatus

import (
	"cmp"
	"math"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

const (
	attrPFName    = device.NICAttrPFName
	attrPFAddress = device.NICAttrPFPCIAddress
	attrProfile   = resourceapi.QualifiedName(device.AttrProfile)
	attrStart     = resourceapi.QualifiedName(device.AttrPlacementStart)
	attrSize      = resourceapi.QualifiedName(device.AttrPlacementSize)
	attrPCIBusID  = deviceattribute.StandardDeviceAttributePCIBusID
)

// gpus is the per-GPU view of the pool's devices that carry a profile.
// Profiles are listed in the order the pool first publishes them.
func gpus(p *pool, u *usage) []GPU {
	type key struct{ gpu, profile string }
	var (
		order    []string
		profiles = map[string][]string{}
		byKey    = map[key][]poolDevice{}
	)
	for _, d := range p.devices {
		prof, bus := stringAttr(d.Device, attrProfile), stringAttr(d.Device, attrPCIBusID)
		if prof == "" || bus == "" {
			continue
		}
		k := key{bus, prof}
		if _, ok := profiles[bus]; !ok {
			order = append(order, bus)
		}
		if len(byKey[k]) == 0 {
			profiles[bus] = append(profiles[bus], prof)
		}
		byKey[k] = append(byKey[k], d)
	}
	if len(order) == 0 {
		return nil
	}
	base := newBudget(p, u)
	slices.Sort(order)
	out := make([]GPU, 0, len(order))
	for _, bus := range order {
		g := GPU{PCIBusID: bus}
		for _, prof := range profiles[bus] {
			devs := byKey[key{bus, prof}]
			pr := Profile{Profile: prof, Allocatable: base.clone().pack(devs, u)}
			for _, d := range devs {
				n := instances(d.Device)
				pr.Devices += n
				pr.Allocated += u.shares(d.Name)
				if d.unavailable {
					pr.Unavailable += n
				}
			}
			g.Profiles = append(g.Profiles, pr)
		}
		out = append(out, g)
	}
	return out
}

// instances is how many instances a device stands for: one, or for a
// device that claims share, how many shares of its request policies'
// default sizes it holds (sharesLeft with nothing consumed).
func instances(d *resourceapi.Device) int32 {
	if !ptr.Deref(d.AllowMultipleAllocations, false) {
		return 1
	}
	return sharesLeft(d, nil)
}

// sharesLeft is how many more shares of the request policies' default
// sizes fit in what a shareable device's capacities have left, the least
// over them: a block of time-sliced vGPUs holds its instances (one each)
// less its shares; a GPU's shares device as many defaults (4Gi, 10%) as
// its memory and compute leave. A capacity without a default is taken
// whole by a share.
func sharesLeft(d *resourceapi.Device, consumed map[resourceapi.QualifiedName]resource.Quantity) int32 {
	n := int64(math.MaxInt32)
	for name, c := range d.Capacity {
		size := c.Value
		if c.RequestPolicy != nil && c.RequestPolicy.Default != nil {
			size = *c.RequestPolicy.Default
		}
		if size.Sign() <= 0 {
			continue
		}
		left := c.Value.DeepCopy()
		left.Sub(consumed[name])
		n = min(n, max(0, left.MilliValue()/size.MilliValue()))
	}
	if n == math.MaxInt32 {
		return 1
	}
	return int32(n)
}

// budget is what is left for new devices on the pool's hardware: counters,
// the compatibility groups of what each counter set already carries, and
// the memory slices in use per GPU.
type budget struct {
	counters map[string]map[string]resource.Quantity
	groups   map[string]groups
	occupied map[string][]span
}

// span is a placement: memory slices [start, start+size).
type span struct{ start, size int64 }

func (s span) overlaps(o span) bool { return s.start < o.start+o.size && o.start < s.start+s.size }

func placement(d *resourceapi.Device) (span, bool) {
	st, ok1 := d.Attributes[attrStart]
	sz, ok2 := d.Attributes[attrSize]
	if !ok1 || !ok2 || st.IntValue == nil || sz.IntValue == nil {
		return span{}, false
	}
	return span{*st.IntValue, *sz.IntValue}, true
}

// newBudget starts from the pool's counter sets and takes off every device
// in use, as the scheduler does (once per device, however many claims
// share it).
func newBudget(p *pool, u *usage) *budget {
	b := &budget{counters: map[string]map[string]resource.Quantity{}, groups: map[string]groups{}, occupied: map[string][]span{}}
	for _, cs := range p.sets {
		m := map[string]resource.Quantity{}
		for name, c := range cs.Counters {
			m[name] = c.Value.DeepCopy()
		}
		b.counters[cs.Name] = m
	}
	for _, d := range p.devices {
		if u.inUse(d.Name) {
			b.take(d.Device)
		}
	}
	return b
}

func (b *budget) clone() *budget {
	c := &budget{counters: map[string]map[string]resource.Quantity{}, groups: map[string]groups{}, occupied: map[string][]span{}}
	for set, m := range b.counters {
		cm := make(map[string]resource.Quantity, len(m))
		for k, v := range m {
			cm[k] = v.DeepCopy()
		}
		c.counters[set] = cm
	}
	for k, v := range b.groups {
		c.groups[k] = v
	}
	for k, v := range b.occupied {
		c.occupied[k] = slices.Clone(v)
	}
	return c
}

// fits: the device's placement is free on its GPU, every counter it
// consumes is left, and its compatibility groups go with what each counter
// set carries.
func (b *budget) fits(d *resourceapi.Device) bool {
	if pl, ok := placement(d); ok {
		for _, o := range b.occupied[stringAttr(d, attrPCIBusID)] {
			if o.overlaps(pl) {
				return false
			}
		}
	}
	for _, c := range d.ConsumesCounters {
		left, ok := b.counters[c.CounterSet]
		if !ok || !b.groups[c.CounterSet].admits(c.CompatibilityGroups) {
			return false
		}
		for name, want := range c.Counters {
			have, ok := left[name]
			if !ok || have.Cmp(want.Value) < 0 {
				return false
			}
		}
	}
	return true
}

func (b *budget) take(d *resourceapi.Device) {
	if pl, ok := placement(d); ok {
		bus := stringAttr(d, attrPCIBusID)
		b.occupied[bus] = append(b.occupied[bus], pl)
	}
	for _, c := range d.ConsumesCounters {
		b.groups[c.CounterSet] = b.groups[c.CounterSet].with(c.CompatibilityGroups)
		left := b.counters[c.CounterSet]
		for name, want := range c.Counters {
			if have, ok := left[name]; ok {
				have.Sub(want.Value)
				left[name] = have
			}
		}
	}
}

// pack counts how many of devs (one profile on one GPU) can be added to
// what is in use: a placement packing. Instances of one profile cost the
// same except for the memory slices of their placement, so taking free
// placements by earliest end, each while the counters still cover it,
// reaches the most instances the placements and the counters allow
// (interval scheduling). Devices in use or unavailable are not candidates,
// except a device that claims share (a block of time-sliced vGPUs, a
// GPU's shares): its counters are charged at its first share, and it
// holds the shares its capacities have left (sharesLeft).
func (b *budget) pack(devs []poolDevice, u *usage) int32 {
	var (
		cands []*resourceapi.Device
		n     int32
	)
	for _, d := range devs {
		switch {
		case d.unavailable:
		case !ptr.Deref(d.AllowMultipleAllocations, false):
			if !u.inUse(d.Name) {
				cands = append(cands, d.Device)
			}
		case u.inUse(d.Name):
			n += sharesLeft(d.Device, u.deviceConsumed[d.Name])
		case b.fits(d.Device):
			b.take(d.Device)
			n += instances(d.Device)
		}
	}
	slices.SortStableFunc(cands, func(x, y *resourceapi.Device) int {
		px, _ := placement(x)
		py, _ := placement(y)
		return cmp.Or(cmp.Compare(px.start+px.size, py.start+py.size), cmp.Compare(px.start, py.start))
	})
	for _, d := range cands {
		if b.fits(d) {
			b.take(d)
			n++
		}
	}
	return n
}

// groups is what one counter set's devices allow beside them
// (compatibility groups): nothing placed admits anything; devices that
// declare no group admit only others without; otherwise a device needs a
// group that every placed device declares.
type groups struct {
	placed bool
	none   bool
	common sets.Set[string]
}

func (g groups) admits(declared []string) bool {
	switch {
	case !g.placed:
		return true
	case len(declared) == 0 || g.none:
		return len(declared) == 0 && g.none
	default:
		return g.common.HasAny(declared...)
	}
}

func (g groups) with(declared []string) groups {
	switch {
	case !g.placed:
		return groups{placed: true, none: len(declared) == 0, common: sets.New(declared...)}
	case g.none || len(declared) == 0:
		return g
	default:
		return groups{placed: true, common: g.common.Intersection(sets.New(declared...))}
	}
}
