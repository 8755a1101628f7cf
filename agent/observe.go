package agent

import (
	"context"
	"errors"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/hwdra/hwdra/prepare"
)

// observed wraps a driver's plugin: every prepare and unprepare is timed,
// labelled with the kind of the claim's devices (kindOf looks a published
// device up). Neither triggers a rescan: what the agent makes for claims
// never changes the published slices.
func observed(d Driver, m *metrics, kindOf func(driver, device string) string) kubeletplugin.DRAPlugin {
	return &observing{DRAPlugin: d.Plugin, driver: d.Name, metrics: m, kindOf: kindOf}
}

type observing struct {
	kubeletplugin.DRAPlugin
	driver  string
	metrics *metrics
	kindOf  func(driver, device string) string
}

// preparedDevices is what prepare.Plugin tells of a prepared claim.
type preparedDevices interface {
	Devices(types.UID) []prepare.Device
}

func (p *observing) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	start := time.Now()
	res, err := p.DRAPlugin.PrepareResourceClaims(ctx, claims)
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

func (p *observing) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	// The devices are known until the claim is unprepared.
	kinds := map[types.UID]string{}
	if pd, ok := p.DRAPlugin.(preparedDevices); ok {
		for _, c := range claims {
			var ks []string
			for _, d := range pd.Devices(c.UID) {
				ks = append(ks, p.kindOf(p.driver, d.Device))
			}
			kinds[c.UID] = claimKind(ks)
		}
	}
	start := time.Now()
	res, err := p.DRAPlugin.UnprepareResourceClaims(ctx, claims)
	for _, c := range claims {
		kind := kinds[c.UID]
		if kind == "" {
			kind = kindUnknown
		}
		p.metrics.observe(p.driver, "unprepare", kind, start, errors.Join(err, res[c.UID]))
	}
	return res, err
}
