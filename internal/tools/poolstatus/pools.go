// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package poolstatus

import (
	"cmp"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	resourcealpha "k8s.io/api/resource/v1alpha3"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// The definitions below are the pool-status controller's (k8s v1.37.2,
// pkg/controller/resourcepoolstatusrequest), so that both report the same
// numbers for the same objects:
//   - only slices at a pool's highest generation count;
//   - a pool with fewer slices than its resourceSliceCount is incomplete:
//     no counts, a validationError starting "PoolIncomplete:";
//   - a device is unavailable when it carries a NoSchedule or NoExecute
//     taint, or a DeviceTaintRule with such an effect selects it;
//   - allocated devices are the distinct devices of the pool in claims'
//     allocation results, adminAccess results left out; available is
//     total - allocated - unavailable, at least 0;
//   - shareable devices' capacities are summed per name, and consumed
//     capacity is summed over every result of the pool.

// Incomplete starts the validationError of a pool that lacks slices of its
// newest generation, as the controller's does.
const Incomplete = "PoolIncomplete:"

// maxListItems is the API's limit on status lists; the controller reports
// an error rather than a longer list.
const maxListItems = 32

// poolDevice is one published device of a pool and whether it is unavailable.
type poolDevice struct {
	*resourceapi.Device
	unavailable bool
}

// pool gathers one pool's slices at its newest generation.
type pool struct {
	name       string
	generation int64
	nodeName   string
	mixedNodes bool
	slices     int32
	want       int64
	devices    []poolDevice
	sets       []resourceapi.CounterSet
}

// usage is what allocated claims use of one pool.
type usage struct {
	// results counts the non-admin results per device.
	results map[string]int32
	// consumed sums consumed capacity over the pool, and per device.
	consumed       map[resourceapi.QualifiedName]resource.Quantity
	deviceConsumed map[string]map[resourceapi.QualifiedName]resource.Quantity
}

func (u *usage) inUse(name string) bool { return u.shares(name) > 0 }

// shares is how many non-admin results use the device.
func (u *usage) shares(name string) int32 {
	if u == nil {
		return 0
	}
	return u.results[name]
}

// Compute reports every pool of driver in c, sorted by name.
func Compute(c Cluster, driver string) []Pool {
	pools := gather(c, driver)
	uses := claimUsage(c.Claims, driver)
	names := make([]string, 0, len(pools))
	for name := range pools {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make([]Pool, 0, len(names))
	for _, name := range names {
		out = append(out, report(driver, pools[name], uses[name]))
	}
	return out
}

// gather collects each pool's slices of its newest generation.
func gather(c Cluster, driver string) map[string]*pool {
	newest := map[string]int64{}
	for i := range c.Slices {
		s := &c.Slices[i].Spec
		if s.Driver != driver {
			continue
		}
		if g, ok := newest[s.Pool.Name]; !ok || s.Pool.Generation > g {
			newest[s.Pool.Name] = s.Pool.Generation
		}
	}
	pools := map[string]*pool{}
	for i := range c.Slices {
		s := &c.Slices[i].Spec
		if s.Driver != driver || s.Pool.Generation < newest[s.Pool.Name] {
			continue
		}
		node := ptr.Deref(s.NodeName, "")
		p := pools[s.Pool.Name]
		if p == nil {
			// The first slice seen gives the expected slice count.
			p = &pool{name: s.Pool.Name, generation: s.Pool.Generation, nodeName: node, want: s.Pool.ResourceSliceCount}
			pools[s.Pool.Name] = p
		} else if node != p.nodeName {
			p.mixedNodes = true
		}
		p.slices++
		p.sets = append(p.sets, s.SharedCounters...)
		for j := range s.Devices {
			d := &s.Devices[j]
			p.devices = append(p.devices, poolDevice{Device: d, unavailable: unavailable(driver, s.Pool.Name, d, c.TaintRules)})
		}
	}
	return pools
}

// unavailable: a taint that keeps new claims off the device, on the device
// or from a rule.
func unavailable(driver, poolName string, d *resourceapi.Device, rules []resourceapi.DeviceTaintRule) bool {
	for _, t := range d.Taints {
		if blocks(t.Effect) {
			return true
		}
	}
	for i := range rules {
		r := &rules[i].Spec
		sel := r.DeviceSelector
		if !blocks(r.Taint.Effect) || sel == nil {
			continue // a rule without a selector selects nothing
		}
		if matches(sel.Driver, driver) && matches(sel.Pool, poolName) && matches(sel.Device, d.Name) {
			return true
		}
	}
	return false
}

func blocks(e resourceapi.DeviceTaintEffect) bool {
	return e == resourceapi.DeviceTaintEffectNoSchedule || e == resourceapi.DeviceTaintEffectNoExecute
}

// matches: an unset selector field matches anything.
func matches(want *string, got string) bool { return want == nil || *want == got }

// claimUsage sums, per pool of driver, what allocated claims use.
func claimUsage(claims []resourceapi.ResourceClaim, driver string) map[string]*usage {
	uses := map[string]*usage{}
	for i := range claims {
		a := claims[i].Status.Allocation
		if a == nil {
			continue
		}
		for _, r := range a.Devices.Results {
			if r.Driver != driver || ptr.Deref(r.AdminAccess, false) {
				continue
			}
			u := uses[r.Pool]
			if u == nil {
				u = &usage{results: map[string]int32{}, consumed: map[resourceapi.QualifiedName]resource.Quantity{},
					deviceConsumed: map[string]map[resourceapi.QualifiedName]resource.Quantity{}}
				uses[r.Pool] = u
			}
			u.results[r.Device]++
			if u.deviceConsumed[r.Device] == nil {
				u.deviceConsumed[r.Device] = map[resourceapi.QualifiedName]resource.Quantity{}
			}
			for name, q := range r.ConsumedCapacity {
				add(u.consumed, name, q)
				add(u.deviceConsumed[r.Device], name, q)
			}
		}
	}
	return uses
}

func add[K comparable](m map[K]resource.Quantity, k K, q resource.Quantity) {
	sum := m[k].DeepCopy()
	sum.Add(q)
	m[k] = sum
}

// report is one pool's status and views.
func report(driver string, p *pool, u *usage) Pool {
	out := Pool{PoolStatus: resourcealpha.PoolStatus{Driver: driver, PoolName: p.name, Generation: p.generation}}
	if p.nodeName != "" && !p.mixedNodes {
		out.NodeName = ptr.To(p.nodeName)
	}
	if int64(p.slices) < p.want {
		out.ValidationError = ptr.To(fmt.Sprintf("%s pool %s/%s has %d of its %d slices at generation %d",
			Incomplete, driver, p.name, p.slices, p.want, p.generation))
		return out
	}
	var allocated, unavail int32
	if u != nil {
		allocated = int32(len(u.results))
	}
	for _, d := range p.devices {
		if d.unavailable {
			unavail++
		}
	}
	total := int32(len(p.devices))
	out.ResourceSliceCount = ptr.To(p.slices)
	out.TotalDevices = ptr.To(total)
	out.AllocatedDevices = ptr.To(allocated)
	out.UnavailableDevices = ptr.To(unavail)
	out.AvailableDevices = ptr.To(max(0, total-allocated-unavail))

	var err string
	out.ShareableSummary, out.SharedDevices, err = shareable(driver, p, u)
	if err != "" {
		out.ValidationError = &err
	}
	out.GPUs = gpus(p, u)
	return out
}

// shareable sums the capacities of the devices that claims share, as the
// controller's shareableSummary does, and lists them one by one.
func shareable(driver string, p *pool, u *usage) (*resourcealpha.ShareableSummaryStatus, []SharedDevice, string) {
	var (
		full, partial int32
		any           bool
		devices       []SharedDevice
		budget        *budget
	)
	total := map[resourceapi.QualifiedName]resource.Quantity{}
	for _, d := range p.devices {
		if !ptr.Deref(d.AllowMultipleAllocations, false) {
			continue
		}
		any = true
		if u.inUse(d.Name) {
			partial++
		} else {
			full++
		}
		sd := SharedDevice{Device: d.Name, PFName: stringAttr(d.Device, attrPFName), PCIAddress: stringAttr(d.Device, attrPFAddress), Unavailable: d.unavailable}
		if len(d.ConsumesCounters) > 0 {
			// A GPU's shares: held off while its other devices are
			// allocated.
			sd.GPU = stringAttr(d.Device, attrPCIBusID)
			if budget == nil {
				budget = newBudget(p, u)
			}
			sd.Held = !u.inUse(d.Name) && !budget.fits(d.Device)
		}
		var consumed map[resourceapi.QualifiedName]resource.Quantity
		if u != nil {
			sd.Allocations = u.results[d.Name]
			consumed = u.deviceConsumed[d.Name]
		}
		for name, c := range d.Capacity {
			add(total, name, c.Value)
		}
		sd.Capacity = capacityStatus(capacities(d.Device), consumed)
		devices = append(devices, sd)
	}
	if !any {
		return nil, nil, ""
	}
	var consumed map[resourceapi.QualifiedName]resource.Quantity
	if u != nil {
		consumed = u.consumed
	}
	list := capacityStatus(total, consumed)
	if len(list) > maxListItems {
		return nil, devices, fmt.Sprintf("ShareableSummaryOverCap: pool %s/%s has %d shareable capacities, more than %d",
			driver, p.name, len(list), maxListItems)
	}
	return &resourcealpha.ShareableSummaryStatus{
		FullyAvailableDevices:     ptr.To(full),
		PartiallyAvailableDevices: ptr.To(partial),
		Capacity:                  list,
	}, devices, ""
}

func capacities(d *resourceapi.Device) map[resourceapi.QualifiedName]resource.Quantity {
	m := make(map[resourceapi.QualifiedName]resource.Quantity, len(d.Capacity))
	for name, c := range d.Capacity {
		m[name] = c.Value
	}
	return m
}

// capacityStatus lists total, consumed and available (at least zero) per
// capacity name of total, sorted by name.
func capacityStatus(total, consumed map[resourceapi.QualifiedName]resource.Quantity) []resourcealpha.ShareableCapacityStatus {
	names := make([]resourceapi.QualifiedName, 0, len(total))
	for name := range total {
		names = append(names, name)
	}
	slices.SortFunc(names, cmp.Compare)
	out := make([]resourcealpha.ShareableCapacityStatus, 0, len(names))
	for _, name := range names {
		t := total[name].DeepCopy()
		c := consumed[name].DeepCopy()
		left := t.DeepCopy()
		left.Sub(c)
		if left.Sign() < 0 {
			left = *resource.NewQuantity(0, t.Format)
		}
		out = append(out, resourcealpha.ShareableCapacityStatus{Name: string(name), Total: &t, Consumed: &c, Available: &left})
	}
	return out
}

func stringAttr(d *resourceapi.Device, name resourceapi.QualifiedName) string {
	if a, ok := d.Attributes[name]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}
