// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build !hwdra_patched_allocator

package resources

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// allocatorVariant names the allocator the fleet benchmarks run:
// k8s.io/dynamic-resource-allocation as released. hack/upstream/bench.sh
// runs them against the patch series of hack/upstream instead
// (fleet_allocator_patched_test.go).
const allocatorVariant = "upstream"

// poolCache stands for the patched allocator's pool cache, which the
// released one does not have: one allocator per pod, built anew.
type poolCache struct{}

func newPoolCache() poolCache { return poolCache{} }

func (poolCache) newAllocator(ctx context.Context, state structured.AllocatedState, lister structured.DeviceClassLister,
	slices []*resourceapi.ResourceSlice, celCache *cel.Cache) (structured.Allocator, error) {
	return structured.NewAllocator(ctx, allocate.ClusterFeatures, state, lister, slices, celCache)
}
