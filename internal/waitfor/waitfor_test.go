// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package waitfor

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestUntilReturnsOnceTrue: the condition is polled until it holds, and
// the wait ends then, long before its timeout.
func TestUntilReturnsOnceTrue(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	start := time.Now()
	err := Until(t.Context(), "third call", 10*time.Second, func() bool { return calls.Add(1) >= 3 })
	if err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("condition called %d times, want 3", n)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("waited %v after the condition held", d)
	}
}

// TestCheckNamesWhatAndLastError: a timeout's error names what was awaited,
// the time waited and the condition's last error.
func TestCheckNamesWhatAndLastError(t *testing.T) {
	t.Parallel()
	cause := errors.New("still 2 slices")
	err := Check(t.Context(), "one slice", 50*time.Millisecond, func() error { return cause })
	if !errors.Is(err, cause) {
		t.Fatalf("error %v does not wrap the condition's", err)
	}
	for _, want := range []string{"one slice", "50ms", "waited", "still 2 slices"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// TestCheckStops: an error made by Stop ends the wait at once, and is
// returned, without the timeout's wording.
func TestCheckStops(t *testing.T) {
	t.Parallel()
	cause := errors.New("the process exited")
	var calls atomic.Int32
	start := time.Now()
	err := Check(t.Context(), "containerd up", time.Hour, func() error {
		if calls.Add(1) < 3 {
			return errors.New("not yet")
		}
		return Stop(cause)
	})
	if !errors.Is(err, cause) || strings.Contains(err.Error(), "not within") || !strings.Contains(err.Error(), "containerd up") {
		t.Fatalf("error %v, want the stopping cause named with what", err)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("condition called %d times, want 3", n)
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("a stopped wait took %v", d)
	}
}

// TestUntilEndsWithContext: a cancelled context ends the wait at once.
func TestUntilEndsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	start := time.Now()
	if err := Until(ctx, "never", time.Hour, func() bool { return false }); err == nil {
		t.Fatal("no error from a cancelled wait")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a cancelled wait took %v", d)
	}
}

// fakeTB records a fatal failure instead of stopping the goroutine.
type fakeTB struct {
	testing.TB
	ctx    context.Context
	failed string
}

func (f *fakeTB) Helper()                  {}
func (f *fakeTB) Context() context.Context { return f.ctx }
func (f *fakeTB) Fatal(args ...any)        { f.failed = "fatal" }
func (f *fakeTB) Fatalf(string, ...any)    { f.failed = "fatal" }

// TestTrueAndNever: True fails where the condition never holds, Never
// where it holds at any time within the window, even if only briefly.
func TestTrueAndNever(t *testing.T) {
	t.Parallel()
	tb := &fakeTB{TB: t, ctx: t.Context()}
	True(tb, "never", 20*time.Millisecond, func() bool { return false })
	if tb.failed == "" {
		t.Error("True passed a condition that never held")
	}
	tb = &fakeTB{TB: t, ctx: t.Context()}
	NoError(tb, "fails", 20*time.Millisecond, func() error { return errFalse })
	if tb.failed == "" {
		t.Error("NoError passed a condition that always failed")
	}
	tb = &fakeTB{TB: t, ctx: t.Context()}
	var calls atomic.Int32
	Never(tb, "third call", 2*time.Second, func() bool { return calls.Add(1) == 3 })
	if tb.failed == "" {
		t.Error("Never passed a condition that held once")
	}
	tb = &fakeTB{TB: t, ctx: t.Context()}
	Never(tb, "always false", 30*time.Millisecond, func() bool { return false })
	if tb.failed != "" {
		t.Error("Never failed a condition that never held")
	}
}
