// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package waitfor is the one way tests wait: a condition polled until it
// holds or a timeout passes (apimachinery's wait.PollUntilContextTimeout),
// and its converse, a condition that must not hold for a while. Tests wait
// on conditions, never on a fixed sleep followed by a check.
package waitfor

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// interval polls often enough that a test waits little beyond the moment
// its condition holds, and seldom enough over long timeouts (an API server,
// a kubelet) that the polling itself is no load.
func interval(timeout time.Duration) time.Duration {
	return min(max(timeout/300, 5*time.Millisecond), 250*time.Millisecond)
}

// stopped is an error that ends a Check at once.
type stopped struct{ error }

func (s stopped) Unwrap() error { return s.error }

// Stop marks an error of cond as final: Check returns it at once instead
// of polling on (a process that exited, an API error no retry mends).
func Stop(err error) error { return stopped{err} }

// Check polls cond, first at once, until it returns nil; after timeout, or
// once ctx ends, it returns an error naming what, the time waited and
// cond's last error. An error made by Stop ends it at once.
func Check(ctx context.Context, what string, timeout time.Duration, cond func() error) error {
	var last error
	start := time.Now()
	err := wait.PollUntilContextTimeout(ctx, interval(timeout), timeout, true, func(context.Context) (bool, error) {
		last = cond()
		var s stopped
		if errors.As(last, &s) {
			return false, s.error
		}
		return last == nil, nil
	})
	if err == nil {
		return nil
	}
	var s stopped
	if errors.As(last, &s) {
		return fmt.Errorf("%s: %w", what, s.error)
	}
	if last == nil {
		last = err
	}
	return fmt.Errorf("%s: not within %v (waited %v): %w", what, timeout, time.Since(start).Round(time.Millisecond), last)
}

// errFalse is a bool condition's error while it does not hold.
var errFalse = errors.New("condition false")

// Until is Check for a condition that holds or not.
func Until(ctx context.Context, what string, timeout time.Duration, cond func() bool) error {
	return Check(ctx, what, timeout, func() error {
		if cond() {
			return nil
		}
		return errFalse
	})
}

// True fails the test unless cond holds within timeout. Like t.Fatal, call
// it from the test's goroutine.
func True(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	if err := Until(t.Context(), what, timeout, cond); err != nil {
		t.Fatal(err)
	}
}

// NoError fails the test unless cond returns nil within timeout; the
// failure carries cond's last error.
func NoError(t testing.TB, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	if err := Check(t.Context(), what, timeout, cond); err != nil {
		t.Fatal(err)
	}
}

// Never fails the test if cond holds at any check during window: a test
// that shows something does not happen must let real time pass, and checks
// throughout it rather than once at its end.
func Never(t testing.TB, what string, window time.Duration, cond func() bool) {
	t.Helper()
	start := time.Now()
	err := wait.PollUntilContextTimeout(t.Context(), interval(window), window, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	switch {
	case err == nil:
		t.Fatalf("%s after %v (watched for %v)", what, time.Since(start).Round(time.Millisecond), window)
	case t.Context().Err() != nil:
		t.Fatalf("%s: test ended while watching: %v", what, err)
	}
}
