// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/metadata"
)

// The agent relies on the API server's granular status authorization to
// keep its claim status writes to its own drivers' entries on claims of
// its node (metadata.CheckStatusAuth). Where it is off the agent warns,
// loudly and for as long as it is off (/readyz, the log and a Warning
// Event on the Node), and serves all the same: refusing to start would
// take the node's devices away from its pods and protect nothing, since
// the kubelet hands the pod its token whether the agent runs or not.

// reasonStatusAuth is the reason of the Node's Event.
const reasonStatusAuth = "ClaimStatusAuthorizationOff"

// statusAuth holds what the last check found.
type statusAuth struct {
	mu   sync.Mutex
	last metadata.StatusAuth
	told bool
}

// warning is the readiness warning while the API server is found
// without granular status authorization, else nil.
func (a *statusAuth) warning() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last == metadata.StatusAuthOff {
		return metadata.StatusAuthWarning()
	}
	return nil
}

// set records a check's finding and says whether it is the first "off"
// since the agent started or since it was last on (the log and the Event
// then tell it).
func (a *statusAuth) set(found metadata.StatusAuth) (tell bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if found == metadata.StatusAuthUnknown {
		return false
	}
	a.last = found
	if found == metadata.StatusAuthOn {
		a.told = false
		return false
	}
	tell, a.told = !a.told, true
	return tell
}

// checkStatusAuth checks now and then every interval (the feature check's,
// default 10 minutes) until ctx ends; while the answer is unknown (no
// allocated claim in the cluster yet), every minute.
func (s *server) checkStatusAuth(ctx context.Context, interval time.Duration) {
	logger := klog.FromContext(ctx)
	if interval <= 0 {
		interval = 10 * time.Minute
	}
	for {
		found, err := metadata.CheckStatusAuth(ctx, s.claims)
		if err != nil {
			logger.V(2).Info("Cannot tell yet whether the API server enforces granular claim status authorization", "err", err)
		}
		if s.statusAuth.set(found) {
			warn := metadata.StatusAuthWarning()
			logger.Info("Warning: "+warn.Error(), "gate", metadata.StatusAuthGate)
			s.events(ctx).Eventf(nodeRef(s.opts.NodeName), nil, corev1.EventTypeWarning, reasonStatusAuth, "CheckClaimStatusAuthorization", "%s", warn.Error())
		}
		next := interval
		if found == metadata.StatusAuthUnknown {
			next = min(interval, time.Minute)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		}
	}
}
