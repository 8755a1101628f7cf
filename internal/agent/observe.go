// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/hwdra/hwdra/internal/agent/prepare"
)

// observed wraps a driver's plugin: every prepare and unprepare is timed,
// labelled with the kind of the claim's devices (kindOf looks a published
// device up). Neither triggers a rescan: what the agent makes for claims
// never changes the published slices.
func observed[R any](d *Driver[R], m *metrics, kindOf func(driver, device string) string) kubeletplugin.DRAPlugin {
	return &observing[R]{Plugin: d.Plugin, driver: d.Name, metrics: m, kindOf: kindOf}
}

type observing[R any] struct {
	*prepare.Plugin[R]
	driver  string
	metrics *metrics
	kindOf  func(driver, device string) string
}

func (p *observing[R]) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	start := time.Now()
	res, err := p.Plugin.PrepareResourceClaims(ctx, claims)
	for _, c := range claims {
		var kinds []string
		if c.Status.Allocation != nil {
			for _, r := range c.Status.Allocation.Devices.Results {
				if r.Driver == p.driver {
					kinds = append(kinds, p.kindOf(p.driver, r.Device))
				}
			}
		}
		p.metrics.observe(p.driver, "prepare", claimKind(kinds), start, errors.Join(err, res[c.UID].Err))
	}
	return res, err
}

func (p *observing[R]) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	// The devices are known until the claim is unprepared.
	kinds := map[types.UID]string{}
	for _, c := range claims {
		var ks []string
		for _, d := range p.Devices(c.UID) {
			ks = append(ks, p.kindOf(p.driver, d.Device))
		}
		kinds[c.UID] = claimKind(ks)
	}
	start := time.Now()
	res, err := p.Plugin.UnprepareResourceClaims(ctx, claims)
	for _, c := range claims {
		p.metrics.observe(p.driver, "unprepare", kinds[c.UID], start, errors.Join(err, res[c.UID]))
	}
	return res, err
}
