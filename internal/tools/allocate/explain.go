// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package allocate

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
)

// ProbeTimeout bounds each allocation Explain tries, as kube-scheduler's
// DynamicResources filter bounds its search (its default filterTimeout):
// the search can take exponential time over devices that do not fit.
const ProbeTimeout = 10 * time.Second

// Explain says why claims that do not fit (Fits fails) cannot be allocated
// now, in the user's terms, one cause per line: for a claim that cannot
// be allocated even on the empty node, that it asks for more devices than
// the API's limit per claim, else the cause per request (no such
// class; the class has no device here; the selectors exclude every device
// of the class; no device has the capacity asked for, or enough of it;
// more devices asked for than match; the matching devices cannot be taken
// together) and, where each request fits alone, which constraint cannot
// be met or that the requests compete for the same devices; for claims
// that fit the empty node, that they do not fit beside what is allocated,
// which requests no longer find a free device, and what keeps each out
// (the devices the allocated claims hold, per counter set the claims
// whose devices exclude or use up what it needs).
func (a *Allocator) Explain(ctx context.Context, claims ...*resourceapi.ResourceClaim) []string {
	empty := a.Empty()
	e := &explainer{a: a, empty: empty}
	var lines []string
	for _, c := range claims {
		if err := probe(ctx, empty, c); err != nil {
			lines = append(lines, fmt.Sprintf("claim %s cannot be allocated on this node:", c.Name))
			for _, l := range e.claim(ctx, c) {
				lines = append(lines, "    "+l)
			}
		}
	}
	if len(lines) > 0 {
		return lines
	}
	if len(claims) > 1 && probe(ctx, empty, claims...) != nil {
		names := make([]string, len(claims))
		for i, c := range claims {
			names[i] = c.Name
		}
		return []string{"each claim fits this node alone, but not all together (they need the same devices or counters): " + strings.Join(names, ", ")}
	}
	lines = append(lines, "the claims fit this node when nothing is allocated, but not beside the claims allocated before them:")
	for _, c := range claims {
		for _, r := range e.requests(c) {
			if probe(ctx, a, r.alone(c)) != nil {
				matching, _ := e.matching(ctx, r)
				why := e.a.inTheWay(matching)
				if len(why) == 0 {
					lines = append(lines, fmt.Sprintf("    claim %s, request %s: those claims hold every device that matches it (%d), or their counters",
						c.Name, r.name, len(matching)))
					continue
				}
				lines = append(lines, fmt.Sprintf("    claim %s, request %s: those claims keep out all %s:", c.Name, r.name, plural(len(matching), "device")+" that match it"))
				for _, l := range why {
					lines = append(lines, "        "+l)
				}
			}
		}
	}
	return lines
}

// probe is Fits bounded by ProbeTimeout, on copies of the claims.
func probe(ctx context.Context, a *Allocator, claims ...*resourceapi.ResourceClaim) error {
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	copies := make([]*resourceapi.ResourceClaim, len(claims))
	for i, c := range claims {
		copies[i] = c.DeepCopy()
		copies[i].Status = resourceapi.ResourceClaimStatus{}
	}
	err := a.Fits(ctx, copies...)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("the allocator found no placement within %v (kube-scheduler gives up after as long): %w", ProbeTimeout, err)
	}
	return err
}

type explainer struct {
	a, empty *Allocator
}

// request is one request of a claim, or one subrequest of a firstAvailable
// request, as an exact request of its own.
type request struct {
	name   string // "gpu", or "gpu/small"
	parent string // the claim's request: "gpu"
	exact  resourceapi.ExactDeviceRequest
}

// alone is claim c with only this request: no constraints, no config.
func (r request) alone(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	claim := &resourceapi.ResourceClaim{ObjectMeta: c.ObjectMeta}
	claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: r.parent, Exactly: r.exact.DeepCopy()}}
	return claim
}

func (e *explainer) requests(c *resourceapi.ResourceClaim) []request {
	var out []request
	for _, r := range c.Spec.Devices.Requests {
		if r.Exactly != nil {
			out = append(out, request{name: r.Name, parent: r.Name, exact: *r.Exactly})
			continue
		}
		for _, s := range r.FirstAvailable {
			out = append(out, request{name: r.Name + "/" + s.Name, parent: r.Name, exact: resourceapi.ExactDeviceRequest{
				DeviceClassName: s.DeviceClassName, Selectors: s.Selectors, AllocationMode: s.AllocationMode, Count: s.Count,
				Tolerations: s.Tolerations, Capacity: s.Capacity, DerivedAttributes: s.DerivedAttributes,
			}})
		}
	}
	return out
}

// claim explains a claim that does not fit the empty node.
func (e *explainer) claim(ctx context.Context, c *resourceapi.ResourceClaim) []string {
	if n := e.fewestDevices(ctx, c); n > resourceapi.AllocationResultsMaxSize {
		// The allocator refuses such a claim before it looks at a device;
		// each request alone may fit, which would blame their competing.
		return []string{fmt.Sprintf("the claim asks for at least %d devices, more than the API's limit of %d devices per claim (an allocation holds at most %d results): split its requests over several claims",
			n, resourceapi.AllocationResultsMaxSize, resourceapi.AllocationResultsMaxSize)}
	}
	var lines []string
	allFit := true
	for _, r := range e.requests(c) {
		line, fits := e.request(ctx, c, r)
		allFit = allFit && fits
		lines = append(lines, "request "+r.name+": "+line)
	}
	if !allFit {
		return lines
	}
	cons := c.Spec.Devices.Constraints
	free := c.DeepCopy()
	free.Spec.Devices.Constraints = nil
	if len(cons) == 0 || probe(ctx, e.empty, free) != nil {
		return append(lines, "each request fits alone, but not all together: they need the same devices, or the same counters (MIG placements of one GPU, a GPU and its partitions, a PF's bandwidth and VFs)")
	}
	var unmet []string
	for i, con := range cons {
		one := c.DeepCopy()
		one.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{con}
		if probe(ctx, e.empty, one) != nil {
			unmet = append(unmet, fmt.Sprintf("constraints[%d] cannot be met: %s", i, describeConstraint(con)))
		}
	}
	if len(unmet) == 0 {
		unmet = []string{"each constraint can be met alone, but not all of them together"}
	}
	return append(lines, unmet...)
}

// fewestDevices is the fewest devices an allocation of c holds, as the
// allocator counts them before it searches: each request's count, a
// prioritized list's smallest, every matching device for allocationMode
// All (none where the class cannot be read: the request explains that).
func (e *explainer) fewestDevices(ctx context.Context, c *resourceapi.ResourceClaim) int {
	total := 0
	for _, req := range c.Spec.Devices.Requests {
		fewest := -1
		for _, r := range e.requests(&resourceapi.ResourceClaim{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}}}) {
			n := int(min(r.exact.Count, int64(resourceapi.AllocationResultsMaxSize+1))) // large counts cannot overflow the sum
			if r.exact.AllocationMode == resourceapi.DeviceAllocationModeAll {
				matching, _ := e.matching(ctx, r)
				n = len(matching)
			}
			if fewest < 0 || n < fewest {
				fewest = n
			}
		}
		total += max(fewest, 0)
	}
	return total
}

func describeConstraint(c resourceapi.DeviceConstraint) string {
	over := "all requests"
	if len(c.Requests) > 0 {
		over = "requests " + strings.Join(c.Requests, ", ")
	}
	switch {
	case c.MatchAttribute != nil:
		return fmt.Sprintf("no devices matching %s share one value of %s", over, *c.MatchAttribute)
	case c.DistinctAttribute != nil:
		return fmt.Sprintf("no devices matching %s have distinct values of %s", over, *c.DistinctAttribute)
	}
	return "over " + over
}

// request explains one request on the empty node: the first cause found,
// or that it fits alone.
func (e *explainer) request(ctx context.Context, c *resourceapi.ResourceClaim, r request) (string, bool) {
	x := r.exact
	class := x.DeviceClassName
	inClass, err := e.classDevices(ctx, class)
	if err != nil {
		return err.Error(), false
	}
	if len(inClass) == 0 {
		return fmt.Sprintf("class %s has no device on this node", class), false
	}
	matching, err := e.filter(ctx, inClass, x.Selectors)
	if err != nil {
		return "selectors: " + err.Error(), false
	}
	if len(matching) == 0 {
		msg := fmt.Sprintf("the selectors exclude all %s of class %s", plural(len(inClass), "device"), class)
		if values := attributeValues(x.Selectors, inClass); values != "" {
			msg += " (" + values + ")"
		}
		return msg, false
	}
	if x.Capacity != nil {
		for _, name := range slices.Sorted(maps.Keys(x.Capacity.Requests)) {
			want := x.Capacity.Requests[name]
			var most *resource.Quantity
			for _, d := range matching {
				if c, ok := d.Capacity[name]; ok {
					if m := mostPerAllocation(c); most == nil || m.Cmp(*most) > 0 {
						most = &m
					}
				}
			}
			switch {
			case most == nil:
				return fmt.Sprintf("capacity %s: no matching device of class %s has it (they have: %s)", name, class, capacityNames(matching)), false
			case want.Cmp(*most) > 0:
				return fmt.Sprintf("capacity %s: asks for %s, but a matching device of class %s gives at most %s to one allocation", name, want.String(), class, most.String()), false
			}
		}
	}
	shared := true
	for _, d := range matching {
		shared = shared && d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
	}
	exact := x.AllocationMode == resourceapi.DeviceAllocationModeExactCount
	if exact && int64(len(matching)) < x.Count && !shared {
		return fmt.Sprintf("%s of class %s requested, %d match", plural(int(x.Count), "device"), class, len(matching)), false
	}
	if line := tooMany(x, matching, e.a.mostTogether(matching)); !shared && line != "" {
		// Said before a search that may run into the timeout: the most
		// that fit follows from the counters alone.
		return line, false
	}
	if err := probe(ctx, e.empty, r.alone(c)); err != nil {
		if !errors.Is(err, ErrUnsatisfiable) {
			return err.Error(), false
		}
		if exact && x.Count > 1 {
			return fmt.Sprintf("%s of class %s match, but no %d of them can be allocated together: they use the same counters (MIG placements of one GPU, a GPU and its partitions) or the same PF's bandwidth and VFs",
				plural(len(matching), "device"), class, x.Count), false
		}
		return fmt.Sprintf("%s of class %s match, but the allocator takes none of them (tainted, or the request's capacity is outside their request policy)",
			plural(len(matching), "device"), class), false
	}
	return fmt.Sprintf("fits alone (%s of class %s match)", plural(len(matching), "device"), class), true
}

// device is a published device with its driver.
type device struct {
	resourceapi.Device
	driver, pool string
}

// classDevices are the published devices of a class, as the allocator
// evaluates the class's selectors.
func (e *explainer) classDevices(ctx context.Context, name string) ([]device, error) {
	class, err := e.a.classes.Get(name)
	if err != nil {
		return nil, fmt.Errorf("device class %s does not exist (classes: %s)", name, strings.Join(e.a.classes.names(), ", "))
	}
	var all []device
	for _, s := range e.a.slices {
		for _, d := range s.Spec.Devices {
			all = append(all, device{Device: d, driver: s.Spec.Driver, pool: s.Spec.Pool.Name})
		}
	}
	out, err := e.filter(ctx, all, class.Spec.Selectors)
	if err != nil {
		return nil, fmt.Errorf("class %s: %w", name, err)
	}
	return out, nil
}

// filter keeps the devices every selector selects; a selector that does
// not compile or fails on a device is an error, as in the allocator.
func (e *explainer) filter(ctx context.Context, in []device, selectors []resourceapi.DeviceSelector) ([]device, error) {
	out := []device{}
next:
	for _, d := range in {
		for _, s := range selectors {
			if s.CEL == nil {
				continue
			}
			res := e.a.cel.GetOrCompile(s.CEL.Expression)
			if res.Error != nil {
				return nil, res.Error
			}
			ok, _, err := res.DeviceMatches(ctx, cel.Device{Driver: d.driver, AllowMultipleAllocations: d.AllowMultipleAllocations, Attributes: d.Attributes, Capacity: d.Capacity})
			if err != nil {
				return nil, fmt.Errorf("device %s: %w", d.Name, err)
			}
			if !ok {
				continue next
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// matching are the devices of r's class that r's selectors select.
func (e *explainer) matching(ctx context.Context, r request) ([]device, error) {
	inClass, err := e.classDevices(ctx, r.exact.DeviceClassName)
	if err != nil {
		return nil, err
	}
	return e.filter(ctx, inClass, r.exact.Selectors)
}

// mostPerAllocation is the most of a capacity one allocation may take:
// the capacity, or less where its request policy says so.
func mostPerAllocation(c resourceapi.DeviceCapacity) resource.Quantity {
	most := c.Value
	if p := c.RequestPolicy; p != nil {
		switch {
		case p.ValidRange != nil && p.ValidRange.Max != nil && p.ValidRange.Max.Cmp(most) < 0:
			most = *p.ValidRange.Max
		case len(p.ValidValues) > 0:
			valid := p.ValidValues[0]
			for _, v := range p.ValidValues {
				if v.Cmp(most) <= 0 && v.Cmp(valid) > 0 {
					valid = v
				}
			}
			most = valid
		}
	}
	return most
}

// capacityNames lists the capacities the devices have.
func capacityNames(ds []device) string {
	var names []string
	for _, d := range ds {
		for n := range d.Capacity {
			if !slices.Contains(names, string(n)) {
				names = append(names, string(n))
			}
		}
	}
	if len(names) == 0 {
		return "none"
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
