// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// recorded collects a FakeRecorder's Events (which blocks on a full
// channel) as they come.
type recorded struct {
	mu   sync.Mutex
	seen []string
}

func recordEvents(t *testing.T) (*events.FakeRecorder, *recorded) {
	rec := events.NewFakeRecorder(16)
	rec.Verbose = true
	got := &recorded{}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case e := <-rec.Events:
				got.mu.Lock()
				got.seen = append(got.seen, e)
				got.mu.Unlock()
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() { close(done) })
	return rec, got
}

func (r *recorded) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

// TestRefusedSlicesToldAndRewritten: while the API server refuses the
// node's slices (as an admission policy or quota would), the publisher is
// unready naming the refusal, records a Warning Event on the Node and
// counts each refusal; once writes are allowed again the slices are
// written within a resync period, although the controller's own backoff
// has grown past what the test waits.
func TestRefusedSlicesToldAndRewritten(t *testing.T) {
	const denial = `ValidatingAdmissionPolicy 'slice-quota' with binding 'slice-quota' denied request: too many devices`
	var refuse atomic.Bool
	refuse.Store(true)
	// The controller retries after 5 ms, doubling at each failure: after
	// 14 its next own try is 41 s away. enoughRefused closes at the 14th.
	const enough = 14
	var refusals atomic.Int32
	enoughRefused := make(chan struct{})
	rec, got := recordEvents(t)
	r := newRig(t, twoGPUs, Options{Resync: 200 * time.Millisecond, Events: rec}, func(c *fake.Clientset) {
		c.PrependReactor("create", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
			if impl, ok := action.(k8stesting.CreateActionImpl); ok && len(impl.CreateOptions.DryRun) > 0 {
				return false, nil, nil
			}
			if !refuse.Load() {
				return false, nil, nil
			}
			if refusals.Add(1) == enough {
				close(enoughRefused)
			}
			return true, nil, apierrors.NewForbidden(resourceapi.Resource("resourceslices"), "", errors.New(denial))
		})
	})
	r.pub.Serve(device.GPUDriver)
	r.serve()

	select {
	case <-enoughRefused:
	case <-time.After(60 * time.Second):
		t.Fatalf("%d refused writes in 60s, want %d", refusals.Load(), enough)
	}
	// Named as the write's error, or after a check of the API server as
	// "the last write was refused: ..." beside what differs.
	if err := r.pub.Verified(); err == nil || !strings.Contains(err.Error(), device.GPUDriver+": ") || !strings.Contains(err.Error(), denial) {
		t.Errorf("Verified while refused: %v; want the refusal named", err)
	}
	// Once the publisher has checked the API server, it says what differs
	// and keeps the refusal beside it.
	var err error
	if werr := waitfor.Until(t.Context(), "Verified naming what differs and the refusal", 30*time.Second, func() bool {
		err = r.pub.Verified()
		return err != nil && strings.Contains(err.Error(), "; the last write was refused: ") && strings.Contains(err.Error(), denial)
	}); werr != nil {
		t.Errorf("%v: last %v", werr, err)
	}
	// The counter moves when the controller hands the publisher the
	// error, after the API server's reactor saw the write refused.
	var n float64
	if werr := waitfor.Until(t.Context(), "every refusal counted", 30*time.Second, func() bool {
		n, _ = r.metric("hwdra_resourceslice_refusals_total", map[string]string{"driver": device.GPUDriver})
		return n >= enough
	}); werr != nil {
		t.Errorf("hwdra_resourceslice_refusals_total %v, want at least %d: %v", n, enough, werr)
	}
	var warned bool
	for _, e := range got.all() {
		warned = warned || strings.HasPrefix(e, "Warning "+reasonRefused+" Publish ") && strings.Contains(e, denial) &&
			strings.HasSuffix(e, "{kind=Node,apiVersion=v1}")
	}
	if !warned {
		t.Errorf("no Warning %s Event on the Node naming the denial; Events: %q", reasonRefused, got.all())
	}

	refuse.Store(false)
	lifted := time.Now()
	r.pool(device.GPUDriver, nil)
	t.Logf("slices written %v after the refusal ended", time.Since(lifted).Round(time.Millisecond))
	if waited := time.Since(lifted); waited > 20*time.Second {
		t.Errorf("slices written %v after the refusal ended: the controller's backoff, not a resync", waited)
	}
	r.verified()
	if err := r.pub.Verified(); err != nil {
		t.Errorf("Verified after the slices were written: %v", err)
	}
}

// TestRefused: which write errors are an operator's to fix.
func TestRefused(t *testing.T) {
	gr := resourceapi.Resource("resourceslices")
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"admission policy", fmt.Errorf("create resource slice: %w", apierrors.NewForbidden(gr, "s", errors.New("denied"))), true},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Group: resourceapi.GroupName, Kind: "ResourceSlice"}, "s", nil), true},
		{"too large", apierrors.NewRequestEntityTooLargeError("limit is 3145728"), true},
		{"quota", apierrors.NewForbidden(gr, "s", errors.New("exceeded quota: slices")), true},
		{"conflict", apierrors.NewConflict(gr, "s", errors.New("changed")), false},
		{"throttled", apierrors.NewTooManyRequests("slow down", 1), false},
		{"gone", apierrors.NewNotFound(gr, "s"), false},
		{"server error", apierrors.NewInternalError(errors.New("etcd")), false},
		{"unreachable", fmt.Errorf("update resource slice: %w", &netError{}), false},
		{"dropped fields", &resourceslice.DroppedFieldsError{}, false},
		{"library validation", errors.New("pool gpu: slice 0: too many devices"), true},
	} {
		if got := refused(tc.err); got != tc.want {
			t.Errorf("%s (%v): refused %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// netError is a transport error (net.Error).
type netError struct{}

func (*netError) Error() string   { return "dial tcp 10.0.0.1:6443: connect: connection refused" }
func (*netError) Timeout() bool   { return false }
func (*netError) Temporary() bool { return false }
