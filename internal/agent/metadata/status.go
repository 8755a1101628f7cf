package metadata

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	// Network is the interface as the pod sees it; nil on failure.
	Network *resourceapi.NetworkDeviceData
	// Message explains the conditions: where the interface is, or why it
	// is not there. Failed makes them False.
	Message string
	Failed  bool
}

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
// with networkData and the Ready and NetworkReady conditions.
func DeviceStatuses(driver string, cs ClaimStatus) []resourceapi.AllocatedDeviceStatus {
	out := make([]resourceapi.AllocatedDeviceStatus, 0, len(cs.Devices))
	for _, d := range cs.Devices {
		e := resourceapi.AllocatedDeviceStatus{Driver: driver, Pool: d.Pool, Device: d.Device, NetworkData: d.Network}
		if d.ShareID != nil {
			share := string(*d.ShareID)
			e.ShareID = &share
		}
		status, reason := metav1.ConditionTrue, ReasonConfigured
		if d.Failed {
			status, reason = metav1.ConditionFalse, ReasonNetworkSetupFailed
		}
		for _, t := range []string{ConditionReady, ConditionNetworkReady} {
			e.Conditions = append(e.Conditions, metav1.Condition{Type: t, Status: status, Reason: reason, Message: d.Message, LastTransitionTime: cs.Time})
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
// status of each claim wins, a failed write is retried with exponential
// backoff (200 ms doubling to a minute) until it succeeds or the claim is
// gone, and nobody waits for it.
type StatusWriter struct {
	client kubernetes.Interface
	driver string
	queue  workqueue.TypedRateLimitingInterface[types.UID]
	// observer, if set, sees each API request's outcome (metrics).
	observer WriteObserver

	mu      sync.Mutex
	pending map[types.UID]pendingStatus
	seq     uint64
}

type pendingStatus struct {
	ClaimStatus
	seq uint64
}

// WriteObserver learns each status write's outcome (the agent's metrics).
type WriteObserver interface {
	ObserveStatusWrite(err error)
}

// NewStatusWriter writes with client, as driver's field manager; observer
// (nil: none) sees each API request's outcome.
func NewStatusWriter(client kubernetes.Interface, driver string, observer WriteObserver) *StatusWriter {
	return newStatusWriter(client, driver, observer, workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](200*time.Millisecond, time.Minute))
}

func newStatusWriter(client kubernetes.Interface, driver string, observer WriteObserver, rl workqueue.TypedRateLimiter[types.UID]) *StatusWriter {
	return &StatusWriter{
		client: client, driver: driver, observer: observer, pending: map[types.UID]pendingStatus{},
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
	logger := klog.FromContext(ctx).WithValues("claim", ps.Claim.String())
	err := w.write(ctx, ps.ClaimStatus)
	switch {
	case err == nil:
	case apierrors.IsNotFound(err) || errors.Is(err, errReplaced):
		// Gone, or replaced by a claim of the same name: nothing to say.
		logger.V(2).Info("Claim gone: its status is not written", "err", err)
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		logger.Error(err, "Claim status refused by the API server; not retried")
	default:
		if ctx.Err() == nil {
			logger.Error(err, "Writing claim status; retrying", "retries", w.queue.NumRequeues(uid))
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

// errReplaced: the claim of that name has another UID now.
var errReplaced = errors.New("claim replaced by a newer one of the same name")

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
	w.wrote(err)
	if apierrors.IsConflict(err) {
		return fmt.Errorf("%w: %v", errReplaced, err) // the UID precondition
	}
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
		w.observer.ObserveStatusWrite(err)
	}
}

// allocationDropped: the apply was refused for a change of
// status.allocation it does not make (see write).
func allocationDropped(err error) bool {
	var se apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &se) || se.Status().Details == nil {
		return false
	}
	for _, c := range se.Status().Details.Causes {
		if c.Field == "status.allocation" {
			return true
		}
	}
	return false
}
