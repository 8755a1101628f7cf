package agent

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// pokeAfter wraps a plugin so that every prepare and unprepare triggers a
// rescan: creating or destroying a MIG instance changes what the GPU can
// still offer.
func pokeAfter(p kubeletplugin.DRAPlugin, poke func()) kubeletplugin.DRAPlugin {
	return &poking{DRAPlugin: p, poke: poke}
}

type poking struct {
	kubeletplugin.DRAPlugin
	poke func()
}

func (p *poking) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	defer p.poke()
	return p.DRAPlugin.PrepareResourceClaims(ctx, claims)
}

func (p *poking) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	defer p.poke()
	return p.DRAPlugin.UnprepareResourceClaims(ctx, claims)
}
