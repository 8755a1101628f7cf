// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package prepare

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/state"
)

// The state of a prepared claim lives in two places on different file
// systems: the checkpoint (the state directory, on disk) and, as an
// annotation, the claim's own CDI spec (the CDI directory, /var/run/cdi),
// which the container runtime needs anyway. When the checkpoint is lost,
// corrupt or of a newer agent, the claims are rebuilt from their specs,
// exactly: the record says what was made for the claim, so its unprepare
// cleans up as if nothing had happened. The specs go with a reboot, and so
// does what they describe.

// ClaimAnnotation holds a claim's checkpoint entry in its CDI spec
// (state.ClaimFormat).
const ClaimAnnotation = "hwdra.io/claim"

// specEntry is the annotation's data.
type specEntry[R any] struct {
	BootID string    `json:"bootID"`
	Claim  *Claim[R] `json:"claim"`
}

func (p *Plugin[R]) annotate(spec *cdispec.Spec, entry *Claim[R]) error {
	raw, err := json.Marshal(specEntry[R]{BootID: p.opts.BootID, Claim: entry})
	if err != nil {
		return err
	}
	spec.Annotations = map[string]string{ClaimAnnotation: string(state.ClaimFormat.Encode(raw))}
	return nil
}

// claimsFromSpecs reads the prepared claims of this boot from the driver's
// claim CDI specs. A spec it cannot read is reported and skipped.
func (p *Plugin[R]) claimsFromSpecs(ctx context.Context) map[types.UID]*Claim[R] {
	logger := klog.FromContext(ctx)
	out := map[types.UID]*Claim[R]{}
	specs, err := p.claimSpecs()
	if err != nil {
		logger.Error(err, "Cannot read the CDI directory to rebuild prepared claims", "dir", p.opts.CDIDir)
		return out
	}
	for uid, path := range specs {
		entry, err := readSpecEntry[R](path, p.opts.BootID)
		switch {
		case errors.Is(err, state.ErrNewer):
			logger.Info("A newer agent prepared this claim: left to it", "file", path, "reason", err)
		case err != nil:
			logger.Error(err, "Cannot rebuild a claim from its CDI spec", "file", path)
		case entry != nil:
			out[uid] = entry
		}
	}
	return out
}

// readSpecEntry returns the claim a spec describes, nil if it is of
// another boot.
func readSpecEntry[R any](path, bootID string) (*Claim[R], error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var spec cdispec.Spec
	if err := yaml.Unmarshal(raw, &spec); err != nil {
		return nil, err
	}
	a, ok := spec.Annotations[ClaimAnnotation]
	if !ok {
		return nil, fmt.Errorf("no %s annotation (written by an older agent)", ClaimAnnotation)
	}
	data, _, err := state.ClaimFormat.Decode([]byte(a))
	if err != nil {
		return nil, fmt.Errorf("annotation %s: %w", ClaimAnnotation, err)
	}
	var e specEntry[R]
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", ClaimAnnotation, err)
	}
	if e.Claim == nil {
		return nil, fmt.Errorf("annotation %s: no claim", ClaimAnnotation)
	}
	if e.BootID != bootID {
		return nil, nil
	}
	return e.Claim, nil
}

// Allocated is what the API server says is allocated to this node's
// pools for the driver, for reclaiming hardware state no prepared claim
// holds: what one of these devices may use is kept.
type Allocated struct {
	// Known is false when the API server could not be asked: then
	// nothing is reclaimed.
	Known   bool
	Devices []AllocatedDevice
}

// AllocatedDevice is one allocation result of a claim.
type AllocatedDevice struct {
	Claim        types.UID
	Pool, Device string
	ShareID      *types.UID
}

// allocated asks the API server (Options.Cluster) for this driver's
// devices of claims it has not prepared.
func (p *Plugin[R]) allocated(ctx context.Context) Allocated {
	if p.opts.Cluster == nil {
		return Allocated{Known: true} // no API server: only prepared claims hold anything
	}
	claims, err := p.opts.Cluster.AllocatedClaims(ctx)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot list the claims allocated to this node: hardware state no prepared claim holds is kept until they can be listed")
		return Allocated{}
	}
	prepared := p.cp.Load().Claims
	out := Allocated{Known: true}
	for _, c := range claims {
		if c.Status.Allocation == nil || prepared[c.UID] != nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != p.opts.DriverName || adminAccess(r) {
				continue
			}
			out.Devices = append(out.Devices, AllocatedDevice{Claim: c.UID, Pool: r.Pool, Device: r.Device, ShareID: r.ShareID})
		}
	}
	return out
}

func adminAccess(r resourceapi.DeviceRequestAllocationResult) bool {
	return r.AdminAccess != nil && *r.AdminAccess
}

// reclaim asks the driver to remove what no claim holds, now and, while it
// keeps something back, again every interval until ctx ends.
func (p *Plugin[R]) reclaim(ctx context.Context) {
	logger := klog.FromContext(ctx)
	kept, err := p.driver.Reclaim(ctx, p.allocated(ctx))
	if err == nil && len(kept) == 0 {
		return
	}
	if err != nil {
		logger.Error(err, "Reclaiming hardware state no prepared claim holds")
	}
	if len(kept) > 0 {
		logger.Info("Keeping hardware state no prepared claim holds while a claim allocated to this node may use it, or until the API server can say", "kept", kept)
	}
	go func() {
		t := time.NewTicker(p.opts.ReclaimInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			kept, err := p.driver.Reclaim(ctx, p.allocated(ctx))
			if err != nil {
				logger.Error(err, "Reclaiming hardware state no prepared claim holds")
				continue
			}
			if len(kept) == 0 {
				logger.Info("Reclaimed the hardware state no prepared claim held")
				return
			}
		}
	}()
}
