// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// allocation is what became of one group of claims.
type allocation struct {
	group claimGroup
	// why is empty when the file's claims are allocated, else the causes
	// (allocate.Explain), one per line.
	why []string
}

// allocateGroups allocates the groups' claims in turn, each group's
// together (as one pod's claims), each beside the claims of the groups
// before it (as the scheduler places pods one after another). A group
// that does not fit is explained and skipped; the rest go on.
func allocateGroups(ctx context.Context, slices []*resourceapi.ResourceSlice, classes []*resourceapi.DeviceClass, groups []claimGroup) []allocation {
	alloc := allocate.New(allocate.ClusterFeatures, NodeName, slices, classes)
	out := make([]allocation, len(groups))
	for i, g := range groups {
		out[i].group = g
		switch err := allocateBounded(ctx, alloc, g.claims); {
		case err == nil:
		case errors.Is(err, errTimeout):
			// Explaining would take as long again, and more: only what
			// the counters tell without a search.
			out[i].why = append([]string{err.Error()}, alloc.TooMany(ctx, g.claims...)...)
		default:
			// Unsatisfiable, or an error such as a class that does not
			// exist: Explain finds it per request.
			out[i].why = alloc.Explain(ctx, g.claims...)
		}
	}
	return out
}

// allocateBounded allocates within the scheduler's filter timeout.
func allocateBounded(ctx context.Context, alloc *allocate.Allocator, claims []*resourceapi.ResourceClaim) error {
	ctx, cancel := context.WithTimeout(ctx, allocate.ProbeTimeout)
	defer cancel()
	err := alloc.Allocate(ctx, claims...)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w within %v (kube-scheduler gives up after as long): %v", errTimeout, allocate.ProbeTimeout, err)
	}
	return err
}

var errTimeout = errors.New("the allocator found no placement")

// notAllocated is the error of the groups that were not allocated, with
// their causes; nil when every group was.
func notAllocated(results []allocation) error {
	var parts []string
	what := "file(s)"
	for _, r := range results {
		if len(r.why) > 0 {
			parts = append(parts, r.group.name+":\n    "+strings.Join(r.why, "\n    "))
		}
		if strings.Contains(r.group.name, ": Pod ") {
			what = "file(s) and pod(s)"
		}
	}
	if len(parts) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d of %d %s:\n  %s", allocate.ErrUnsatisfiable, len(parts), len(results), what, strings.Join(parts, "\n  "))
}

// capacityNotes say where the allocator counts another amount of a
// capacity than a request of c asked for: its request policy rounds a
// request up to a valid amount, and one below the minimum, zero or
// negative (the API server takes any) to the minimum.
func capacityNotes(c *resourceapi.ResourceClaim) []string {
	asked := map[string]*resourceapi.CapacityRequirements{}
	for _, r := range c.Spec.Devices.Requests {
		if r.Exactly != nil {
			asked[r.Name] = r.Exactly.Capacity
		}
		for _, s := range r.FirstAvailable {
			asked[r.Name+"/"+s.Name] = s.Capacity
		}
	}
	var notes []string
	for _, res := range c.Status.Allocation.Devices.Results {
		want := asked[res.Request]
		if want == nil {
			continue
		}
		for _, name := range slices.Sorted(maps.Keys(res.ConsumedCapacity)) {
			got := res.ConsumedCapacity[name]
			if q, ok := want.Requests[name]; ok && q.Cmp(got) != 0 {
				notes = append(notes, fmt.Sprintf("note: claim %s, request %s asks for %s of %s; the allocator counts %s (the device's request policy rounds a request up to its minimum and steps)",
					c.Name, res.Request, q.String(), name, got.String()))
			}
		}
	}
	return notes
}
