// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package allocate

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// deviceKey names a published device: driver/pool/device.
type deviceKey string

func keyOf(driver, pool, device string) deviceKey {
	return deviceKey(driver + "/" + pool + "/" + device)
}

// holdRecord remembers which claims hold which devices (a.mu is held), for
// the explanations: the allocator's own state knows devices, not claims.
func (a *Allocator) holdRecord(claim string, result *resourceapi.AllocationResult, add bool) {
	if a.holders == nil {
		a.holders = map[deviceKey][]string{}
	}
	for _, r := range result.Devices.Results {
		k := keyOf(r.Driver, r.Pool, r.Device)
		if add {
			a.holders[k] = append(a.holders[k], claim)
			continue
		}
		if i := slices.Index(a.holders[k], claim); i >= 0 {
			a.holders[k] = slices.Delete(a.holders[k], i, i+1)
		}
		if len(a.holders[k]) == 0 {
			delete(a.holders, k)
		}
	}
}

// setKey names a counter set: driver/pool/set (counter set names are
// unique within a pool).
type setKey struct{ driver, pool, set string }

// heldDevice is an allocated device, with the claims that hold it.
type heldDevice struct {
	device
	claims []string
}

// inTheWay says why none of the matching devices of a request that fits
// the empty node is free now: which devices the claims allocated before
// hold, and, per counter set (on hwdra's GPUs: per GPU), which allocated
// devices keep the rest out, because they share no compatibility group
// with them (MIG partitions and vGPUs of one GPU) or use up a counter
// they need. One line per cause, the devices and claims named.
func (a *Allocator) inTheWay(matching []device) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var held []heldDevice
	capacity := map[setKey]map[string]resourceapi.Counter{}
	for _, s := range a.slices {
		for _, cs := range s.Spec.SharedCounters {
			capacity[setKey{s.Spec.Driver, s.Spec.Pool.Name, cs.Name}] = cs.Counters
		}
		for _, d := range s.Spec.Devices {
			if claims := a.holders[keyOf(s.Spec.Driver, s.Spec.Pool.Name, d.Name)]; len(claims) > 0 {
				held = append(held, heldDevice{device{Device: d, driver: s.Spec.Driver, pool: s.Spec.Pool.Name}, claims})
			}
		}
	}
	var lines []string
	taken := 0
	byClaim := map[string]int{}
	blocked := map[setKey][]device{}
	for _, m := range matching {
		if claims := a.holders[keyOf(m.driver, m.pool, m.Name)]; len(claims) > 0 && !isShared(m) {
			taken++
			for _, c := range claims {
				byClaim[c]++
			}
			continue
		}
		for _, c := range m.ConsumesCounters {
			k := setKey{m.driver, m.pool, c.CounterSet}
			blocked[k] = append(blocked[k], m)
		}
	}
	if taken > 0 {
		var who []string
		for _, c := range slices.Sorted(maps.Keys(byClaim)) {
			who = append(who, fmt.Sprintf("%s (%d)", c, byClaim[c]))
		}
		lines = append(lines, fmt.Sprintf("%s held by claims allocated before: %s", plural(taken, "matching device"), strings.Join(who, ", ")))
	}
	for _, k := range slices.SortedFunc(maps.Keys(blocked), func(x, y setKey) int { return strings.Compare(x.driver+x.pool+x.set, y.driver+y.pool+y.set) }) {
		if line := setInTheWay(k, blocked[k], held, capacity[k]); line != "" {
			lines = append(lines, line)
		}
	}
	return lines
}

// setInTheWay explains one counter set: the allocated devices on it whose
// compatibility groups exclude the matching devices', else those that use
// up a counter the matching devices need.
func setInTheWay(k setKey, want []device, held []heldDevice, capacity map[string]resourceapi.Counter) string {
	wantGroups := map[string]bool{}
	for _, d := range want {
		for _, g := range consumption(d, k).CompatibilityGroups {
			wantGroups[g] = true
		}
	}
	var on, excluding []heldDevice
	used := map[string]resource.Quantity{}
	for _, h := range held {
		if h.driver != k.driver || h.pool != k.pool {
			continue
		}
		c := consumption(h.device, k)
		if c == nil {
			continue
		}
		on = append(on, h)
		if !slices.ContainsFunc(c.CompatibilityGroups, func(g string) bool { return wantGroups[g] }) {
			excluding = append(excluding, h)
		}
		for name, n := range c.Counters {
			q := used[name]
			q.Add(n.Value)
			used[name] = q
		}
	}
	where := "counter set " + k.set
	if gpu := gpuOf(on); gpu != "" {
		where = fmt.Sprintf("GPU %s (counter set %s)", gpu, k.set)
	}
	if len(excluding) > 0 {
		var theirs []string
		for _, h := range excluding {
			theirs = append(theirs, consumption(h.device, k).CompatibilityGroups...)
		}
		why := exclusionHint(excluding, want)
		if why == "" {
			why = "devices of one counter set are allocated together only where they share a compatibility group"
		}
		return fmt.Sprintf("%s: %s; they share no compatibility group with the %s there (theirs: %s; these: %s): %s",
			where, describeHeld(excluding), plural(len(want), "matching device"), groupList(theirs), groupList(slices.Collect(maps.Keys(wantGroups))), why)
	}
	var short []string
	for _, name := range slices.Sorted(maps.Keys(capacity)) {
		total, u := capacity[name].Value, used[name]
		for _, d := range want {
			if need, ok := consumption(d, k).Counters[name]; ok {
				free := total.DeepCopy()
				free.Sub(u)
				if free.Cmp(need.Value) < 0 {
					short = append(short, fmt.Sprintf("%s (%s of %s used)", name, u.String(), total.String()))
					break
				}
			}
		}
	}
	if len(short) == 0 || len(on) == 0 {
		return ""
	}
	return fmt.Sprintf("%s: %s; they use up %s, which the %s there need", where, describeHeld(on), strings.Join(short, ", "), plural(len(want), "matching device"))
}

// consumption is d's consumption of counter set k; nil if none.
func consumption(d device, k setKey) *resourceapi.DeviceCounterConsumption {
	for i, c := range d.ConsumesCounters {
		if c.CounterSet == k.set {
			return &d.ConsumesCounters[i]
		}
	}
	return nil
}

// describeHeld: "claim a holds x and y; claims b, c hold z", in the
// order of the devices.
func describeHeld(hs []heldDevice) string {
	var holders []string
	devices := map[string][]string{}
	for _, h := range hs {
		who := strings.Join(h.claims, ", ")
		if _, ok := devices[who]; !ok {
			holders = append(holders, who)
		}
		devices[who] = append(devices[who], h.Name)
	}
	var parts []string
	for _, who := range holders {
		verb := "claim %s holds %s"
		if strings.Contains(who, ", ") {
			verb = "claims %s hold %s"
		}
		ds := devices[who]
		list := ds[0]
		if len(ds) > 1 {
			list = strings.Join(ds[:len(ds)-1], ", ") + " and " + ds[len(ds)-1]
		}
		parts = append(parts, fmt.Sprintf(verb, who, list))
	}
	return strings.Join(parts, "; ")
}

// groupList: the distinct groups, sorted; "none" for none.
func groupList(groups []string) string {
	slices.Sort(groups)
	groups = slices.Compact(groups)
	if len(groups) == 0 {
		return "none"
	}
	return strings.Join(groups, ", ")
}

// gpuOf is the PCI address of the GPU that hwdra's devices on a counter
// set belong to (the slices give a partition or vGPU its GPU's
// resource.kubernetes.io/pciBusID), "" for other devices.
func gpuOf(hs []heldDevice) string {
	for _, h := range hs {
		if _, ok := h.Attributes[typeAttribute]; !ok {
			continue
		}
		if v, ok := h.Attributes["resource.kubernetes.io/pciBusID"]; ok && v.StringValue != nil {
			return *v.StringValue
		}
	}
	return ""
}

// typeAttribute is hwdra's device type (gpu.hwdra.io/type: mig, vgpu...).
const typeAttribute = "gpu.hwdra.io/type"

// exclusionHint says in hwdra's terms what excludes what, where the
// devices carry hwdra's type attribute: "MIG partitions and vGPUs of one
// GPU exclude each other".
func exclusionHint(excluding []heldDevice, want []device) string {
	kind := func(d device) string {
		v, ok := d.Attributes[typeAttribute]
		if !ok || v.StringValue == nil {
			return ""
		}
		return map[string]string{"mig": "MIG partitions", "vgpu": "vGPUs", "gpu": "whole GPUs", "share": "GPU shares"}[*v.StringValue]
	}
	var theirs, ours []string
	for _, h := range excluding {
		if k := kind(h.device); k != "" && !slices.Contains(theirs, k) {
			theirs = append(theirs, k)
		}
	}
	for _, d := range want {
		if k := kind(d); k != "" && !slices.Contains(ours, k) {
			ours = append(ours, k)
		}
	}
	if len(theirs) == 0 || len(ours) == 0 || slices.Equal(theirs, ours) {
		return ""
	}
	return fmt.Sprintf("%s and %s of one GPU exclude each other", strings.Join(theirs, ", "), strings.Join(ours, ", "))
}

func isShared(d device) bool {
	return d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
}
