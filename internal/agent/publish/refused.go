// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// A node whose slices the API server refuses (an admission policy or
// webhook, a quota, an object it finds invalid or too large) offers
// nothing new to the scheduler, and only the operator can fix the cause.
// The controller retries with a backoff that grows to 1000 s, and its
// readiness goes false (verify.go); here the refusal is also told where an
// operator looks (a Warning Event on the Node, a counter), and once the
// cause is fixed the slices are written within a resync period, not after
// the controller's backoff: a publication not verified for that long is
// handed to its controller again.

// reasonRefused is the reason of the Node's Event.
const reasonRefused = "ResourceSlicesRefused"

// defaultResync is Options.Resync's default.
const defaultResync = 30 * time.Second

// refused says whether err is the API server refusing a write for good:
// a 4xx answer other than a conflict, a throttle or a missing object
// (races the controller settles by itself), or the library refusing the
// pool before any write (its validation).
func refused(err error) bool {
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) {
		return false // not refused: the fields of a gate that is off dropped (features.go)
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		// The controller's own validation errors are plain errors
		// reported without a retry; transport errors wrap no status.
		return !isTransient(err)
	}
	switch code := status.Status().Code; {
	case code == http.StatusConflict, code == http.StatusTooManyRequests, code == http.StatusNotFound:
		return false
	default:
		return code >= 400 && code < 500
	}
}

// isTransient: the API server not reached (its address refused, a
// timeout, the context ending): nothing an Event could reach either.
func isTransient(err error) bool {
	var netErr net.Error
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.As(err, &netErr)
}

// reportRefusal tells a refused write of driver's slices: a Warning Event
// on the Node (the Events library folds repeats into a series) and the
// refusals counter.
func (p *Publisher) reportRefusal(ctx context.Context, driver string, err error) {
	p.mu.Lock()
	p.refusal[driver] = err
	p.mu.Unlock()
	p.metrics.refusals.WithLabelValues(driver).Inc()
	if p.opts.Events == nil {
		return
	}
	note := fmt.Sprintf("the API server refused the %s ResourceSlices of this node: %v", driver, err)
	// An Event's note holds at most 1 KiB.
	if len(note) > 1024 {
		note = note[:1021] + "..."
	}
	// UID: the node's name, as the kubelet's Events have it; kubectl
	// describe node shows Events of the Node's UID and of its name.
	node := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: p.opts.NodeName, UID: types.UID(p.opts.NodeName)}
	p.opts.Events.Eventf(node, nil, corev1.EventTypeWarning, reasonRefused, "Publish", "%s", note)
	klog.FromContext(ctx).V(2).Info("Refused ResourceSlice write reported", "driver", driver)
}

// resyncStale hands a driver's last publication to its controller again
// when it has not been verified for a resync period since it was last
// handed over: the controller then writes it now rather than after its
// backoff. Handing over what the API server already holds writes nothing.
func (p *Publisher) resyncStale(ctx context.Context, driver string, now time.Time) {
	p.mu.Lock()
	c, want := p.controllers[driver], p.published[driver]
	due := c != nil && now.Sub(p.handed[driver]) >= p.opts.Resync
	if due {
		p.handed[driver] = now
	}
	p.mu.Unlock()
	if !due {
		return
	}
	klog.FromContext(ctx).Info("ResourceSlices still not in the API server: handing them to the controller again", "driver", driver, "after", p.opts.Resync)
	c.Update(want.DeepCopy())
}
