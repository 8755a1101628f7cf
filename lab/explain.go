package lab

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"

	"github.com/hwdra/hwdra/allocate"
)

// filterTimeout is how long the allocator may search, as kube-scheduler's
// DynamicResources filter (its default filterTimeout): the search can
// take exponential time over claims that do not fit together.
const filterTimeout = 10 * time.Second

// allocateAll allocates the claims together, as the scheduler does for one
// pod's claims. A claim that cannot be placed even alone is reported first,
// in the user's terms, without the (possibly long) search over all.
func allocateAll(ctx context.Context, slices []*resourceapi.ResourceSlice, classes []*resourceapi.DeviceClass, claims []*resourceapi.ResourceClaim) error {
	if err := explain(ctx, slices, classes, claims); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, filterTimeout)
	defer cancel()
	err := allocate.New(allocate.ClusterFeatures, NodeName, slices, classes).Allocate(ctx, claims...)
	if errors.Is(err, allocate.ErrUnsatisfiable) {
		names := make([]string, len(claims))
		for i, c := range claims {
			names[i] = c.Name
		}
		return fmt.Errorf("%w: each claim fits alone, but not all together: %s", allocate.ErrUnsatisfiable, strings.Join(names, ", "))
	}
	if ctx.Err() != nil {
		return fmt.Errorf("the allocator found no placement for all %d claims together within %v (kube-scheduler gives up after as long): %w", len(claims), filterTimeout, err)
	}
	return err
}

// explain says which claims cannot be met even alone and why, in the
// user's terms ("request many: 9 devices of class gpu.hwdra.io requested,
// 8 match"): for such a claim each request's class and selectors are
// matched against every published device. It returns nil when every claim
// fits alone.
func explain(ctx context.Context, slices []*resourceapi.ResourceSlice, classes []*resourceapi.DeviceClass, claims []*resourceapi.ResourceClaim) error {
	byName := map[string]*resourceapi.DeviceClass{}
	for _, c := range classes {
		byName[c.Name] = c
	}
	var problems []string
	for _, c := range claims {
		alone := c.DeepCopy()
		err := allocate.New(allocate.ClusterFeatures, NodeName, slices, classes).Allocate(ctx, alone)
		if err == nil {
			continue
		}
		if !errors.Is(err, allocate.ErrUnsatisfiable) {
			problems = append(problems, fmt.Sprintf("claim %s: %v", c.Name, err))
			continue
		}
		var why []string
		for _, r := range c.Spec.Devices.Requests {
			if r.Exactly != nil {
				e := r.Exactly
				why = append(why, requestShortfall(ctx, "request "+r.Name, e.DeviceClassName, e.Selectors, e.AllocationMode, e.Count, slices, byName))
				continue
			}
			for _, s := range r.FirstAvailable {
				why = append(why, requestShortfall(ctx, "request "+r.Name+"/"+s.Name, s.DeviceClassName, s.Selectors, s.AllocationMode, s.Count, slices, byName))
			}
		}
		if len(c.Spec.Devices.Constraints) > 0 {
			why = append(why, fmt.Sprintf("and %d constraint(s) over them", len(c.Spec.Devices.Constraints)))
		}
		problems = append(problems, fmt.Sprintf("claim %s cannot be allocated on this node:\n    %s", c.Name, strings.Join(why, "\n    ")))
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w:\n  %s", allocate.ErrUnsatisfiable, strings.Join(problems, "\n  "))
}

// requestShortfall describes one request against the published devices:
// how many it wants and how many match its class and selectors.
func requestShortfall(ctx context.Context, what, class string, selectors []resourceapi.DeviceSelector,
	mode resourceapi.DeviceAllocationMode, count int64, slices []*resourceapi.ResourceSlice, classes map[string]*resourceapi.DeviceClass) string {
	dc, ok := classes[class]
	if !ok {
		return fmt.Sprintf("%s: device class %s does not exist", what, class)
	}
	var compiled []cel.CompilationResult
	for _, sel := range append(append([]resourceapi.DeviceSelector(nil), dc.Spec.Selectors...), selectors...) {
		if sel.CEL == nil {
			continue
		}
		res := cel.GetCompiler(cel.Features{EnableConsumableCapacity: true}).CompileCELExpression(sel.CEL.Expression, cel.Options{})
		if res.Error != nil {
			return fmt.Sprintf("%s: %v", what, res.Error)
		}
		compiled = append(compiled, res)
	}
	matches := 0
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			ok, err := deviceMatches(ctx, s.Spec.Driver, d, compiled)
			if err != nil {
				return fmt.Sprintf("%s: device %s: %v", what, d.Name, err)
			}
			if ok {
				matches++
			}
		}
	}
	want := fmt.Sprintf("%d device(s)", count)
	if mode == resourceapi.DeviceAllocationModeAll {
		want = "all devices"
	}
	switch {
	case matches == 0 || mode == resourceapi.DeviceAllocationModeExactCount && int64(matches) < count:
		return fmt.Sprintf("%s: %s of class %s requested, %d match", what, want, class, matches)
	default:
		return fmt.Sprintf("%s: %s of class %s requested, %d match, but not enough of them are free at once (shared counters: partitions overlap or the GPU is taken; bandwidth or VFs of a PF used up; or a constraint)",
			what, want, class, matches)
	}
}

// deviceMatches evaluates compiled selectors in order, as the allocator
// does: a class's first, so a request's never sees another driver's device.
func deviceMatches(ctx context.Context, driver string, d resourceapi.Device, selectors []cel.CompilationResult) (bool, error) {
	for _, sel := range selectors {
		ok, _, err := sel.DeviceMatches(ctx, cel.Device{Driver: driver, AllowMultipleAllocations: d.AllowMultipleAllocations, Attributes: d.Attributes, Capacity: d.Capacity})
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}
