// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package allocate

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// attributeRef finds the attributes a CEL selector tests:
// device.attributes["gpu.hwdra.io"].profile.
var attributeRef = regexp.MustCompile(`device\.attributes\["([^"]+)"\]\.([A-Za-z_][A-Za-z0-9_]*)`)

// maxValuesShown bounds the values a hint lists.
const maxValuesShown = 24

// attributeValues says which values the devices have of the attributes
// the selectors test ("gpu.hwdra.io/profile: 1g.10gb, 2g.20gb, ..."): a
// selector that excludes every device most often names a value none has
// (a MIG profile of another GPU model, a typo).
func attributeValues(selectors []resourceapi.DeviceSelector, devices []device) string {
	var parts []string
	seen := map[string]bool{}
	for _, s := range selectors {
		if s.CEL == nil {
			continue
		}
		for _, m := range attributeRef.FindAllStringSubmatch(s.CEL.Expression, -1) {
			name := resourceapi.QualifiedName(m[1] + "/" + m[2])
			if seen[string(name)] {
				continue
			}
			seen[string(name)] = true
			values := map[string]bool{}
			for _, d := range devices {
				if v, ok := d.Attributes[name]; ok {
					values[attributeString(v)] = true
				}
			}
			if len(values) == 0 {
				parts = append(parts, fmt.Sprintf("none has %s", name))
				continue
			}
			list := slices.Sorted(maps.Keys(values))
			if len(list) > maxValuesShown {
				list = append(list[:maxValuesShown], "...")
			}
			parts = append(parts, fmt.Sprintf("their %s: %s", name, strings.Join(list, ", ")))
		}
	}
	return strings.Join(parts, "; ")
}

func attributeString(v resourceapi.DeviceAttribute) string {
	switch {
	case v.StringValue != nil:
		return *v.StringValue
	case v.IntValue != nil:
		return fmt.Sprint(*v.IntValue)
	case v.BoolValue != nil:
		return fmt.Sprint(*v.BoolValue)
	case v.VersionValue != nil:
		return *v.VersionValue
	}
	return "?"
}

// counterKey names a counter of a pool's counter set.
type counterKey struct{ driver, pool, set, counter string }

// mostTogether is how many of the devices can be allocated at once as
// their shared counters allow (MIG placements of one GPU, a GPU and its
// partitions, a PF's bandwidth and VFs), packed greedily in name order
// (which is placement order for hwdra's MIG devices: for partitions of
// one size that is the most there is room for); -1 where the devices use
// no counters (each fits beside the others).
func (a *Allocator) mostTogether(devices []device) int {
	left := map[counterKey]resource.Quantity{}
	for _, s := range a.slices {
		for _, set := range s.Spec.SharedCounters {
			for name, c := range set.Counters {
				left[counterKey{s.Spec.Driver, s.Spec.Pool.Name, set.Name, name}] = c.Value.DeepCopy()
			}
		}
	}
	used := false
	n := 0
	sorted := slices.SortedFunc(slices.Values(devices), func(x, y device) int { return strings.Compare(x.Name, y.Name) })
next:
	for _, d := range sorted {
		var take []counterKey
		var amounts []resource.Quantity
		for _, c := range d.ConsumesCounters {
			for name, q := range c.Counters {
				used = true
				k := counterKey{d.driver, d.pool, c.CounterSet, name}
				have, ok := left[k]
				if !ok || have.Cmp(q.Value) < 0 {
					continue next
				}
				take, amounts = append(take, k), append(amounts, q.Value)
			}
		}
		for i, k := range take {
			q := left[k]
			q.Sub(amounts[i])
			left[k] = q
		}
		n++
	}
	if !used {
		return -1
	}
	return n
}

// TooMany says, for each request of the claims, cheaply (no search: for
// a search that ran out of time), where it asks for more devices than
// their shared counters let the node hold at once, with the most that
// fit.
func (a *Allocator) TooMany(ctx context.Context, claims ...*resourceapi.ResourceClaim) []string {
	e := &explainer{a: a, empty: a.Empty()}
	var lines []string
	for _, c := range claims {
		for _, r := range e.requests(c) {
			if r.exact.AllocationMode != resourceapi.DeviceAllocationModeExactCount {
				continue
			}
			matching, err := e.matching(ctx, r)
			if err != nil {
				continue
			}
			if line := tooMany(r.exact, matching, a.mostTogether(matching)); line != "" {
				lines = append(lines, fmt.Sprintf("claim %s, request %s: %s", c.Name, r.name, line))
			}
		}
	}
	return lines
}

// tooMany says that an exact request asks for more devices than match,
// or than their counters let the node hold at once (most; -1: no
// counters); "" where neither.
func tooMany(x resourceapi.ExactDeviceRequest, matching []device, most int) string {
	asked := plural(int(x.Count), "device") + " of class " + x.DeviceClassName + " requested"
	switch {
	case x.AllocationMode != resourceapi.DeviceAllocationModeExactCount:
	case int64(len(matching)) < x.Count:
		return fmt.Sprintf("%s, %d match", asked, len(matching))
	case most >= 0 && int64(most) < x.Count:
		return fmt.Sprintf("%s, at most %d of the %d that match fit this node together: they use the same counters (MIG placements of one GPU, a GPU and its partitions, a PF's bandwidth and VFs)", asked, most, len(matching))
	}
	return ""
}
