package metadata

import (
	"context"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	metaac "k8s.io/client-go/applyconfigurations/meta/v1"
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

// ApplyConfiguration is the server-side apply of a claim's status: one
// status.devices entry per device, keyed as the API keys them (driver,
// pool, device, shareID), with networkData and the Ready and NetworkReady
// conditions. The UID makes the API server refuse it for a newer claim of
// the same name.
func ApplyConfiguration(driver string, cs ClaimStatus) *resourceac.ResourceClaimApplyConfiguration {
	st := resourceac.ResourceClaimStatus()
	for _, d := range cs.Devices {
		e := resourceac.AllocatedDeviceStatus().WithDriver(driver).WithPool(d.Pool).WithDevice(d.Device)
		if d.ShareID != nil {
			e.WithShareID(string(*d.ShareID))
		}
		status, reason := metav1.ConditionTrue, ReasonConfigured
		if d.Failed {
			status, reason = metav1.ConditionFalse, ReasonNetworkSetupFailed
		}
		for _, t := range []string{ConditionReady, ConditionNetworkReady} {
			e.WithConditions(metaac.Condition().WithType(t).WithStatus(status).WithReason(reason).
				WithMessage(d.Message).WithLastTransitionTime(cs.Time))
		}
		if n := d.Network; n != nil {
			e.WithNetworkData(resourceac.NetworkDeviceData().WithInterfaceName(n.InterfaceName).
				WithIPs(n.IPs...).WithHardwareAddress(n.HardwareAddress))
		}
		st.WithDevices(e)
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
	// OnWrite, if set, sees each API request's outcome (metrics).
	OnWrite func(err error)

	mu      sync.Mutex
	pending map[types.UID]pendingStatus
	seq     uint64
}

type pendingStatus struct {
	ClaimStatus
	seq uint64
}

// NewStatusWriter writes with client, as driver's field manager.
func NewStatusWriter(client kubernetes.Interface, driver string) *StatusWriter {
	return newStatusWriter(client, driver, workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](200*time.Millisecond, time.Minute))
}

func newStatusWriter(client kubernetes.Interface, driver string, rl workqueue.TypedRateLimiter[types.UID]) *StatusWriter {
	return &StatusWriter{
		client: client, driver: driver, pending: map[types.UID]pendingStatus{},
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
	reqCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := w.client.ResourceV1().ResourceClaims(ps.Claim.Namespace).ApplyStatus(reqCtx,
		ApplyConfiguration(w.driver, ps.ClaimStatus), metav1.ApplyOptions{FieldManager: w.driver, Force: true})
	cancel()
	if w.OnWrite != nil {
		w.OnWrite(err)
	}
	switch {
	case err == nil:
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		// Gone, or replaced by a claim of the same name (UID mismatch):
		// nothing left to say.
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

// succeeded queues Ready status for the claims with a VF moved into a
// pod (all: every claim of the pod). An apply names all of a claim's
// devices: one it leaves out loses its entry.
func (p *Plugin) succeeded(done []attached, all bool) {
	changed := map[types.UID]bool{}
	for _, d := range done {
		changed[d.Claim.UID] = changed[d.Claim.UID] || d.Moved || all
	}
	var devs []claimDevice
	for _, d := range done {
		if changed[d.Claim.UID] {
			devs = append(devs, claimDevice{d.Claim, DeviceStatus{Pool: d.VF.Pool, Device: d.VF.Device, ShareID: d.VF.ShareID,
				Network: networkData(d), Message: "interface " + d.Interface + " configured in the pod"}})
		}
	}
	p.report(devs)
}

// failed queues not-Ready status, with the reason, for the claims of a
// pod whose VFs could not be set up.
func (p *Plugin) failed(atts []attachment, err error) {
	devs := make([]claimDevice, 0, len(atts))
	for _, a := range atts {
		devs = append(devs, claimDevice{a.Claim, DeviceStatus{Pool: a.VF.Pool, Device: a.VF.Device, ShareID: a.VF.ShareID, Failed: true, Message: err.Error()}})
	}
	p.report(devs)
}

type claimDevice struct {
	claim ClaimRef
	DeviceStatus
}

// report queues one ClaimStatus per claim, its devices in order.
func (p *Plugin) report(devs []claimDevice) {
	if p.opts.Status == nil {
		return
	}
	now := metav1.Now()
	byClaim := map[types.UID]*ClaimStatus{}
	var order []types.UID
	for _, d := range devs {
		cs := byClaim[d.claim.UID]
		if cs == nil {
			cs = &ClaimStatus{Claim: d.claim, Time: now}
			byClaim[d.claim.UID] = cs
			order = append(order, d.claim.UID)
		}
		cs.Devices = append(cs.Devices, d.DeviceStatus)
	}
	for _, uid := range order {
		p.opts.Status.Set(*byClaim[uid])
	}
}
