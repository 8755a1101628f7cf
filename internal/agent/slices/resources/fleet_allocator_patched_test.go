// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build hwdra_patched_allocator

package resources

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// allocatorVariant: the allocator with hack/upstream's patch series
// (hack/upstream/bench.sh builds the benchmarks with this tag against the
// patched sources).
const allocatorVariant = "patched"

// poolCache is the patched allocator's PoolCache, kept from pod to pod as
// the patched scheduler keeps it.
type poolCache struct{ cache *structured.PoolCache }

func newPoolCache() poolCache { return poolCache{structured.NewPoolCache()} }

func (p poolCache) newAllocator(ctx context.Context, state structured.AllocatedState, lister structured.DeviceClassLister,
	slices []*resourceapi.ResourceSlice, celCache *cel.Cache) (structured.Allocator, error) {
	return structured.NewAllocatorWithOptions(ctx, allocate.ClusterFeatures, state, lister, slices, celCache,
		structured.Options{PoolCache: p.cache})
}
