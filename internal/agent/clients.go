// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	"k8s.io/client-go/util/flowcontrol"
)

// Client names, the "client" label of the throttling metrics.
const (
	clientClaims = "claims" // the kubelet plugins: a claim GET per prepare
	clientSlices = "slices" // ResourceSlice publishing and its informer
	clientStatus = "status" // claim status writes, after prepare and in NRI hooks
)

// newClients returns the agent's API clients. Each has a rate limiter of
// its own (qps, burst), so a prepare's claim GET never waits behind
// ResourceSlice writes or claim status writes: with one shared limiter a
// republish of a few slices queued every prepare behind it (client-go's
// default of 5 QPS, burst 10). Every request passes through wrap.
func newClients(rc *rest.Config, qps float32, burst int, m *metrics, wrap transport.WrapperFunc) (claims, slices, status kubernetes.Interface, err error) {
	newClient := func(name string) (kubernetes.Interface, error) {
		c := rest.CopyConfig(rc)
		c.Wrap(wrap)
		c.QPS, c.Burst = qps, burst
		c.RateLimiter = &measuredLimiter{
			RateLimiter: flowcontrol.NewTokenBucketRateLimiter(qps, burst),
			throttled:   m.throttled.WithLabelValues(name),
			waited:      m.throttleWait.WithLabelValues(name),
		}
		return kubernetes.NewForConfig(c)
	}
	if claims, err = newClient(clientClaims); err != nil {
		return nil, nil, nil, err
	}
	if slices, err = newClient(clientSlices); err != nil {
		return nil, nil, nil, err
	}
	if status, err = newClient(clientStatus); err != nil {
		return nil, nil, nil, err
	}
	return claims, slices, status, nil
}

// measuredLimiter counts the requests that had to wait for a token and
// how long they waited.
type measuredLimiter struct {
	flowcontrol.RateLimiter
	throttled prometheus.Counter
	waited    prometheus.Observer
}

func (l *measuredLimiter) Wait(ctx context.Context) error {
	if l.TryAccept() {
		return nil
	}
	l.throttled.Inc()
	start := time.Now()
	err := l.RateLimiter.Wait(ctx)
	l.waited.Observe(time.Since(start).Seconds())
	return err
}
