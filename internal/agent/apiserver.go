// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// Backoff of the "cannot reach the API server" warning: said at once, then
// again after each interval while it lasts, the interval doubling up to
// the last.
const (
	unreachableFirstRepeat = 5 * time.Second
	unreachableLastRepeat  = 5 * time.Minute
)

// apiServer watches whether the API server answers the agent: every
// request of its clients passes through it (wrap), so it knows without
// asking itself. The clients retry on their own (informers relist, the
// kubelet retries prepares); without it they did so for minutes in
// silence, and /readyz said only "starting".
type apiServer struct {
	host   string // the server's URL
	source string // where its address came from: "--kubeconfig F", ...

	mu      sync.Mutex
	err     error     // the last failure; nil while the server answers
	since   time.Time // when the failures began
	changed chan struct{}
}

func newAPIServer(rc *rest.Config, source string) *apiServer {
	return &apiServer{host: rc.Host, source: source, changed: make(chan struct{}, 1)}
}

// wrap is a rest.Config transport wrapper that records each request's
// outcome: any HTTP answer means the server is reached; a failure to get
// one (connection refused, TLS, timeout) that it is not. A request its
// caller gave up on says nothing.
func (a *apiServer) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err == nil || req.Context().Err() == nil {
			a.observe(err)
		}
		return resp, err
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func (a *apiServer) observe(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	was := a.err != nil
	switch {
	case err != nil && !was:
		a.since = time.Now()
	case err == nil && !was:
		return
	}
	a.err = err
	if was != (err != nil) {
		select {
		case a.changed <- struct{}{}:
		default:
		}
	}
}

// unreachable is nil while the server answers, else what is unreachable,
// since when and why: what /readyz says.
func (a *apiServer) unreachable() error {
	if a == nil {
		return nil
	}
	since, err := a.state()
	if err == nil {
		return nil
	}
	return fmt.Errorf("the API server %s (%s) is unreachable for %v: %w", a.host, a.source, time.Since(since).Round(time.Second), err)
}

// state is when the failures began and the last one (nil while the
// server answers).
func (a *apiServer) state() (time.Time, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.since, a.err
}

// report logs, at the default verbosity, when the server stops answering
// (at once, then again with backoff while it lasts) and when it answers
// again, until ctx ends. While it does not answer, check asks it again
// with backoff, so that its return is seen even when nothing else of the
// agent asks (watches that broke wait for their informer's backoff).
func (a *apiServer) report(ctx context.Context, check func(context.Context) error) {
	logger := klog.FromContext(ctx)
	var (
		down      bool
		warnAt    time.Time
		warnEvery = unreachableFirstRepeat
		retry     = checkFirstRetry
	)
	for {
		since, err := a.state()
		if err == nil {
			if down {
				logger.Info("The API server answers again", "server", a.host, "after", time.Since(since).Round(time.Second))
				down, warnAt, warnEvery, retry = false, time.Time{}, unreachableFirstRepeat, checkFirstRetry
			}
			select {
			case <-ctx.Done():
				return
			case <-a.changed:
			}
			continue
		}
		down = true
		if now := time.Now(); !now.Before(warnAt) {
			logger.Info("Warning: cannot reach the API server: claims cannot be read nor devices published until it answers; retrying",
				"server", a.host, "from", a.source, "err", err, "for", time.Since(since).Round(time.Second), "nextWarningIn", warnEvery)
			warnAt, warnEvery = now.Add(warnEvery), min(2*warnEvery, unreachableLastRepeat)
		}
		select {
		case <-ctx.Done():
			return
		case <-a.changed:
			continue
		case <-time.After(retry):
		}
		retry = min(2*retry, checkLastRetry)
		checkCtx, cancel := context.WithTimeout(ctx, checkTimeout)
		_ = check(checkCtx) // its outcome arrives through wrap
		cancel()
	}
}

// While the server does not answer, report asks it again after
// checkFirstRetry, the wait doubling up to checkLastRetry.
const (
	checkFirstRetry = time.Second
	checkLastRetry  = 30 * time.Second
	checkTimeout    = 10 * time.Second
)
