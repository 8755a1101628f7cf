// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package metadata

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	resourceac "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Condition types and reasons of a device's status.devices entry.
const (
	ConditionReady        = "Ready"
	ConditionNetworkReady = "NetworkReady"

	ReasonConfigured         = "InterfaceConfigured"
	ReasonNetworkSetupFailed = "NetworkSetupFailed"
	// ReasonSandboxStopped: the pod's sandbox stopped and its VF is back
	// in the host network namespace, reserved for the claim.
	ReasonSandboxStopped = "SandboxStopped"
	// ReasonPrepared: the device is prepared for the claim's containers.
	ReasonPrepared = "Prepared"
)

// ClaimRef names a claim.
type ClaimRef struct {
	UID             types.UID
	Namespace, Name string
}

func (c ClaimRef) String() string { return c.Namespace + "/" + c.Name }

// DeviceStatus is what the driver says about one allocated device.
type DeviceStatus struct {
	Pool, Device string
	ShareID      *types.UID
	// Network is the interface as the pod sees it; nil for a device
	// that is no network device, and for one whose interface is not in a
	// pod (failed, or its sandbox stopped).
	Network *resourceapi.NetworkDeviceData
	// Data is the driver's own data about the device (a GPU's UUIDs, MIG
	// IDs, share limits): a JSON object, or nil.
	Data json.RawMessage
	// Conditions are the entry's conditions; Message explains them all.
	Conditions []Condition
	Message    string
}

// Condition is one condition of an entry.
type Condition struct {
	Type   string
	True   bool
	Reason string
}

// NetworkConfigured: the VF is configured in its pod (Ready and
// NetworkReady).
func NetworkConfigured() []Condition {
	return []Condition{{ConditionReady, true, ReasonConfigured}, {ConditionNetworkReady, true, ReasonConfigured}}
}

// NetworkFailed: the VF could not be set up in its pod.
func NetworkFailed() []Condition {
	return []Condition{{ConditionReady, false, ReasonNetworkSetupFailed}, {ConditionNetworkReady, false, ReasonNetworkSetupFailed}}
}

// NetworkStopped: the pod's sandbox stopped; the VF is prepared, in the
// host, and in no pod.
func NetworkStopped() []Condition {
	return []Condition{{ConditionReady, true, ReasonPrepared}, {ConditionNetworkReady, false, ReasonSandboxStopped}}
}

// Prepared: a device without a network, prepared (Ready).
func Prepared() []Condition { return []Condition{{ConditionReady, true, ReasonPrepared}} }

// ClaimStatus is everything the driver says about one claim: an apply
// replaces the driver's entries of the claim with these.
type ClaimStatus struct {
	Claim   ClaimRef
	Devices []DeviceStatus
	// Time is when the conditions took their values.
	Time metav1.Time
}

// DeviceStatuses are the driver's status.devices entries of a claim: one
// per device, keyed as the API keys them (driver, pool, device, shareID),
// with networkData, data and conditions.
func DeviceStatuses(driver string, cs ClaimStatus) []resourceapi.AllocatedDeviceStatus {
	out := make([]resourceapi.AllocatedDeviceStatus, 0, len(cs.Devices))
	for _, d := range cs.Devices {
		e := resourceapi.AllocatedDeviceStatus{Driver: driver, Pool: d.Pool, Device: d.Device, NetworkData: d.Network}
		if d.ShareID != nil {
			share := string(*d.ShareID)
			e.ShareID = &share
		}
		if d.Data != nil {
			e.Data = &runtime.RawExtension{Raw: d.Data}
		}
		for _, c := range d.Conditions {
			status := metav1.ConditionFalse
			if c.True {
				status = metav1.ConditionTrue
			}
			e.Conditions = append(e.Conditions, metav1.Condition{Type: c.Type, Status: status, Reason: c.Reason, Message: d.Message, LastTransitionTime: cs.Time})
		}
		out = append(out, e)
	}
	return out
}

// ApplyConfiguration is the server-side apply of a claim's status: the
// DeviceStatuses and nothing else. The UID makes the API server refuse it
// for a newer claim of the same name.
func ApplyConfiguration(driver string, cs ClaimStatus) *resourceac.ResourceClaimApplyConfiguration {
	// The apply configuration has the typed status's JSON form.
	raw, err := json.Marshal(resourceapi.ResourceClaimStatus{Devices: DeviceStatuses(driver, cs)})
	st := &resourceac.ResourceClaimStatusApplyConfiguration{}
	if err == nil {
		err = json.Unmarshal(raw, st)
	}
	if err != nil {
		panic(fmt.Sprintf("status.devices round trip: %v", err)) // plain structs: cannot fail
	}
	return resourceac.ResourceClaim(cs.Claim.Name, cs.Claim.Namespace).WithUID(cs.Claim.UID).WithStatus(st)
}

// StatusWriter applies claims' status in the background: the latest
// status of each claim wins, nobody waits for it, and a failed write is
// retried with exponential backoff (200 ms doubling to a minute) where a
// retry can succeed: a claim gone (deleted, replaced, deallocated) or a
// write the API server refuses (forbidden, invalid) is dropped and said
// once per driver and kind of refusal.
type StatusWriter struct {
	client kubernetes.Interface
	driver string
	queue  workqueue.TypedRateLimitingInterface[types.UID]
	// observer, if set, sees each API request's outcome (metrics).
	observer WriteObserver

	mu      sync.Mutex
	pending map[types.UID]pendingStatus
	seq     uint64
	told    map[string]bool // kinds of refusal logged
}

type pendingStatus struct {
	ClaimStatus
	seq uint64
}

// Results of a status write request (WriteObserver).
const (
	WriteSuccess = "success"
	// WriteRefused: the API server refused it (forbidden: the agent may
	// not write the driver's entries; invalid). Not retried; the 1.37.2
	// apply refusal the writer works around by an update is one too.
	WriteRefused = "refused"
	// WriteGone: the claim is deleted, replaced or deallocated.
	WriteGone = "gone"
	// WriteError: it failed on the way (timeout, server error, conflict):
	// retried.
	WriteError = "error"
)

// WriteObserver learns each status write request's outcome (the agent's
// metrics): the driver whose entries it wrote and one of the Write*
// results.
type WriteObserver interface {
	ObserveStatusWrite(driver, result string)
}

// NewStatusWriter writes with client, as driver's field manager; observer
// (nil: none) sees each API request's outcome.
func NewStatusWriter(client kubernetes.Interface, driver string, observer WriteObserver) *StatusWriter {
	return newStatusWriter(client, driver, observer, workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](200*time.Millisecond, time.Minute))
}

func newStatusWriter(client kubernetes.Interface, driver string, observer WriteObserver, rl workqueue.TypedRateLimiter[types.UID]) *StatusWriter {
	return &StatusWriter{
		client: client, driver: driver, observer: observer, pending: map[types.UID]pendingStatus{}, told: map[string]bool{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(rl, workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: driver + "-claim-status"}),
	}
}

// Set queues a claim's status; it never blocks.
func (w *StatusWriter) Set(cs ClaimStatus) {
	w.mu.Lock()
	w.seq++
	w.pending[cs.Claim.UID] = pendingStatus{ClaimStatus: cs, seq: w.seq}
	w.mu.Unlock()
	w.queue.Add(cs.Claim.UID)
}

// Pending is how many claims' status is not written yet.
func (w *StatusWriter) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pending)
}

// Run writes until ctx ends.
func (w *StatusWriter) Run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	for w.next(ctx) {
	}
}

func (w *StatusWriter) next(ctx context.Context) bool {
	uid, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(uid)
	w.mu.Lock()
	ps, ok := w.pending[uid]
	w.mu.Unlock()
	if !ok {
		w.queue.Forget(uid)
		return true
	}
	logger := klog.FromContext(ctx).WithValues("claim", ps.Claim.String(), "driver", w.driver)
	err := w.write(ctx, ps.ClaimStatus)
	switch result(err) {
	case WriteSuccess:
	case WriteGone:
		logger.V(2).Info("Claim gone (deleted, replaced or deallocated): its status is not written", "err", err)
	case WriteRefused:
		msg := "Claim status refused by the API server; not retried (later claims are tried again)"
		if apierrors.IsForbidden(err) {
			msg = "Claim status forbidden: the agent's service account needs resourceclaims/status and resourceclaims/driver (associated-node:update, associated-node:patch) for this driver, as the chart's ClusterRole grants; not retried"
		}
		w.tellOnce(logger, "refused/"+string(apierrors.ReasonForError(err)), msg, err)
	default:
		if ctx.Err() == nil {
			w.tellOnce(logger, "error", "Writing claim status; retrying with backoff (said once; later failures at verbosity 2)", err)
			w.queue.AddRateLimited(uid)
			return true
		}
	}
	w.mu.Lock()
	if cur, ok := w.pending[uid]; ok && cur.seq == ps.seq {
		delete(w.pending, uid)
	}
	w.mu.Unlock()
	w.queue.Forget(uid)
	return true
}

// tellOnce logs a kind of failure at error level the first time, at
// verbosity 2 after.
func (w *StatusWriter) tellOnce(logger klog.Logger, kind, msg string, err error) {
	w.mu.Lock()
	first := !w.told[kind]
	w.told[kind] = true
	w.mu.Unlock()
	if first {
		logger.Error(err, msg)
		return
	}
	logger.V(2).Info(msg, "err", err)
}

// errReplaced: the claim of that name has another UID now.
var errReplaced = errors.New("claim replaced by a newer one of the same name")

// result sorts a write's outcome.
func result(err error) string {
	switch {
	case err == nil:
		return WriteSuccess
	case apierrors.IsNotFound(err) || errors.Is(err, errReplaced) || deallocated(err):
		return WriteGone
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		return WriteRefused
	}
	return WriteError
}

// write applies a claim's status. The Kubernetes 1.37.2 API server drops
// status.allocation from a server-side apply of the status of a claim
// whose allocation carries opaque device configuration (and then refuses
// it: "status.allocation: field cannot be modified once set"); for those
// the entries are written by an update that replaces the driver's own
// entries and keeps everything else (a read and a write, with the
// resourceVersion guarding against lost updates).
func (w *StatusWriter) write(ctx context.Context, cs ClaimStatus) error {
	reqCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	claims := w.client.ResourceV1().ResourceClaims(cs.Claim.Namespace)
	_, err := claims.ApplyStatus(reqCtx, ApplyConfiguration(w.driver, cs), metav1.ApplyOptions{FieldManager: w.driver, Force: true})
	if apierrors.IsConflict(err) {
		err = fmt.Errorf("%w: %v", errReplaced, err) // the UID precondition
	}
	w.wrote(err)
	if !allocationDropped(err) {
		return err
	}
	c, err := claims.Get(reqCtx, cs.Claim.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if c.UID != cs.Claim.UID {
		return errReplaced
	}
	devices := DeviceStatuses(w.driver, cs)
	for _, d := range c.Status.Devices {
		if d.Driver != w.driver {
			devices = append(devices, d)
		}
	}
	c.Status.Devices = devices
	_, err = claims.UpdateStatus(reqCtx, c, metav1.UpdateOptions{FieldManager: w.driver})
	w.wrote(err)
	return err // a conflict is retried
}

func (w *StatusWriter) wrote(err error) {
	if w.observer != nil {
		w.observer.ObserveStatusWrite(w.driver, result(err))
	}
}

// allocationDropped: the apply was refused for a change of
// status.allocation it does not make (see write).
func allocationDropped(err error) bool {
	return invalidAt(err, func(c metav1.StatusCause) bool { return c.Field == "status.allocation" })
}

// deallocated: the entries name devices the claim no longer has
// allocated (it was deallocated meanwhile: the API server drops the
// entries of deallocated devices itself).
func deallocated(err error) bool {
	return invalidAt(err, func(c metav1.StatusCause) bool {
		return strings.HasPrefix(c.Field, "status.devices") && strings.Contains(c.Message, "must be an allocated device")
	})
}

func invalidAt(err error, match func(metav1.StatusCause) bool) bool {
	var se apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &se) || se.Status().Details == nil {
		return false
	}
	for _, c := range se.Status().Details.Causes {
		if match(c) {
			return true
		}
	}
	return false
}
