// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// A publication succeeded when the API server holds it: every pool of the
// driver complete in its latest generation, with exactly the devices
// handed to the slice controller and their taints, and no other pool of
// the node. The controller writes in the background and reports only
// failures, so the publisher checks with one list of the node's slices
// (from the API server's watch cache) after each publication, and again
// with backoff until it holds. That is the readiness probe's "last publish
// succeeded"; a node at rest makes no such call.

var errNotVerified = fmt.Errorf("not yet seen in the API server")

// toVerify marks a driver's publication unverified, for why (a
// publication not checked yet, or a failed write), and wakes the check.
func (p *Publisher) toVerify(driver string, why error) {
	p.mu.Lock()
	p.verified[driver] = why
	p.mu.Unlock()
	select {
	case p.verifyPoke <- struct{}{}:
	default:
	}
}

// Verified is nil once every served driver's last publication is in the
// API server, else why not: the agent's readiness.
func (p *Publisher) Verified() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var problems []string
	for _, d := range p.drivers {
		err, ok := p.verified[d]
		switch {
		case !ok:
			problems = append(problems, d+": not published yet")
		case err != nil && p.refusal[d] != nil && err != p.refusal[d]:
			problems = append(problems, d+": "+err.Error()+"; the last write was refused: "+p.refusal[d].Error())
		case err != nil:
			problems = append(problems, d+": "+err.Error())
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("ResourceSlices: %s", strings.Join(problems, "; "))
	}
	return nil
}

// verifyLoop checks pending publications until ctx ends: at once, then
// with backoff from 500 ms to the resync period while one does not hold
// (handing it to its controller again after a resync period, refused.go),
// and at once after a controller's write.
func (p *Publisher) verifyLoop(ctx context.Context) {
	first := min(500*time.Millisecond, p.opts.Resync)
	backoff := first
	for {
		pending := false
		p.mu.Lock()
		var todo []string
		for d, err := range p.verified {
			if err != nil {
				todo = append(todo, d)
			}
		}
		p.mu.Unlock()
		for _, d := range todo {
			err := p.verify(ctx, d)
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			// A publication meanwhile is verified next round.
			if p.verified[d] != nil {
				p.verified[d] = err
			}
			if err == nil {
				delete(p.refusal, d)
			}
			p.mu.Unlock()
			if err != nil {
				pending = true
				klog.FromContext(ctx).V(2).Info("Published ResourceSlices not in the API server yet", "driver", d, "reason", err)
				p.resyncStale(ctx, d, time.Now())
			}
		}
		if !pending {
			backoff = first
			select {
			case <-ctx.Done():
				return
			case <-p.verifyPoke:
			}
			continue
		}
		// The next check: after the backoff, when poked, or as soon as a
		// controller has written (its stats, in process): a write that
		// was refused or failed may have gone through.
		deadline, writes := time.Now().Add(backoff), p.writes()
		backoff = min(2*backoff, p.opts.Resync)
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-p.verifyPoke:
				break wait
			case <-time.After(min(writesPoll, time.Until(deadline))):
				if !time.Now().Before(deadline) || p.writes() != writes {
					break wait
				}
			}
		}
	}
}

// writesPoll is how often an unverified publication's controllers'
// write counts are looked at.
const writesPoll = 250 * time.Millisecond

// writes is how many writes the controllers have made.
func (p *Publisher) writes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, c := range p.controllers {
		st := c.GetStats()
		n += st.NumCreates + st.NumUpdates + st.NumDeletes
	}
	return n
}

// verify compares the API server's slices of the driver with the last
// publication.
func (p *Publisher) verify(ctx context.Context, driver string) error {
	p.mu.Lock()
	want, ok := p.published[driver]
	p.mu.Unlock()
	if !ok {
		return errNotVerified
	}
	list, err := p.opts.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector:   resourceapi.ResourceSliceSelectorNodeName + "=" + p.opts.NodeName + "," + resourceapi.ResourceSliceSelectorDriver + "=" + driver,
		ResourceVersion: "0",
	})
	if err != nil {
		return fmt.Errorf("listing: %w", err)
	}
	return sameSlices(want, list.Items)
}

// sameSlices reports how the stored slices differ from the published
// resources, nil when they do not.
func sameSlices(want resourceslice.DriverResources, have []resourceapi.ResourceSlice) error {
	latest := map[string]int64{}
	for _, s := range have {
		if g, ok := latest[s.Spec.Pool.Name]; !ok || s.Spec.Pool.Generation > g {
			latest[s.Spec.Pool.Name] = s.Spec.Pool.Generation
		}
	}
	for pool := range latest {
		if _, ok := want.Pools[pool]; !ok {
			return fmt.Errorf("pool %s is no longer published but still stored", pool)
		}
	}
	for name, pool := range want.Pools {
		wantDevices := map[string]string{}
		for _, s := range pool.Slices {
			for i := range s.Devices {
				wantDevices[s.Devices[i].Name] = taintKey(s.Devices[i].Taints)
			}
		}
		gen, ok := latest[name]
		if !ok {
			if len(wantDevices) == 0 {
				continue
			}
			return fmt.Errorf("pool %s not stored", name)
		}
		haveDevices := map[string]string{}
		slices, count := 0, int64(0)
		for _, s := range have {
			if s.Spec.Pool.Name != name || s.Spec.Pool.Generation != gen {
				continue
			}
			slices++
			count = s.Spec.Pool.ResourceSliceCount
			for i := range s.Spec.Devices {
				haveDevices[s.Spec.Devices[i].Name] = taintKey(s.Spec.Devices[i].Taints)
			}
		}
		if int64(slices) != count {
			return fmt.Errorf("pool %s generation %d incomplete: %d of %d slices", name, gen, slices, count)
		}
		for d, taints := range wantDevices {
			got, ok := haveDevices[d]
			switch {
			case !ok:
				return fmt.Errorf("pool %s: device %s not stored", name, d)
			case got != taints:
				return fmt.Errorf("pool %s: device %s stored with taints [%s], published with [%s]", name, d, got, taints)
			}
		}
		if len(haveDevices) != len(wantDevices) {
			return fmt.Errorf("pool %s: %d devices stored, %d published", name, len(haveDevices), len(wantDevices))
		}
	}
	return nil
}

func taintKey(taints []resourceapi.DeviceTaint) string {
	out := make([]string, 0, len(taints))
	for _, t := range taints {
		out = append(out, t.Key+"="+t.Value+":"+string(t.Effect))
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}
