package agent

import (
	"context"
	"errors"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// observed wraps a driver's plugin: every prepare and unprepare is timed.
// Neither triggers a rescan: what the agent makes for claims never changes
// the published slices.
func observed(d Driver, m *metrics) kubeletplugin.DRAPlugin {
	return &observing{DRAPlugin: d.Plugin, driver: d.Name, metrics: m}
}

type observing struct {
	kubeletplugin.DRAPlugin
	driver  string
	metrics *metrics
}

func (p *observing) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	start := time.Now()
	res, err := p.DRAPlugin.PrepareResourceClaims(ctx, claims)
	for _, c := range claims {
		p.metrics.observe(p.driver, "prepare", start, errors.Join(err, res[c.UID].Err))
	}
	return res, err
}

func (p *observing) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	start := time.Now()
	res, err := p.DRAPlugin.UnprepareResourceClaims(ctx, claims)
	for _, c := range claims {
		p.metrics.observe(p.driver, "unprepare", start, errors.Join(err, res[c.UID]))
	}
	return res, err
}
