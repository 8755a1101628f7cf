// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package prepare

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/api"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/keyedlock"
	"github.com/hwdra/hwdra/internal/state"
)

// Device is one prepared device of a claim, as the checkpoint keeps it.
type Device struct {
	Requests []string   `json:"requests"`
	Pool     string     `json:"pool"`
	Device   string     `json:"device"`
	ShareID  *types.UID `json:"shareID,omitempty"`
	// Edits are what a container using the device gets (device nodes,
	// environment, mounts). Nil: no CDI device.
	Edits *cdispec.ContainerEdits `json:"edits,omitempty"`
	// Attributes are the device metadata written for the container now.
	// Nil defers metadata (network devices: written once the pod's network
	// exists).
	Attributes map[string]resourceapi.DeviceAttribute `json:"attributes,omitempty"`
	// CDIDeviceIDs are filled in by the plugin when it writes the spec.
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
}

// Driver does the hardware part of prepare for one driver name. R is its
// record of applied side effects, kept in the checkpoint.
type Driver[R any] interface {
	// Prepare plans and applies a claim's devices of this driver. Before each
	// side effect something must cover it so that a crash right after it
	// leaves nothing behind: either the driver's own record of what it
	// makes (a ledger that Reconcile reads at start), or the claim's record
	// passed to save (an intent is enough: "creating instance of profile P
	// at placement X"), which Unprepare undoes at start. Each save is a
	// checkpoint write (an fsync): a driver whose ledger covers everything
	// never calls it. On error it returns the record of what was applied;
	// the plugin then calls Unprepare.
	Prepare(ctx context.Context, claim *resourceapi.ResourceClaim, save func(R) error) ([]Device, R, error)
	// Unprepare undoes a record: idempotent, and it tolerates records of
	// side effects that were only intended or were already undone.
	Unprepare(ctx context.Context, claim types.UID, record R) error
	// Restore runs at start, before any prepare: it learns what the
	// prepared claims' records hold.
	Restore(ctx context.Context, owned map[types.UID]R)
	// Reclaim removes hardware state this driver made that no prepared
	// claim holds (left by a crash, or by a checkpoint lost without the
	// claims' CDI specs), but keeps what a device allocated to this node
	// may use, and everything when allocated is not Known. It returns what
	// it kept; the plugin calls it again later until nothing is kept. It
	// runs at start and then beside prepares.
	Reclaim(ctx context.Context, allocated Allocated) (kept []string, err error)
}

// ErrorHandler takes background errors (publish.Publisher: a field the
// API server dropped makes it fall back to a model the cluster keeps).
type ErrorHandler interface {
	HandleError(ctx context.Context, err error, msg string)
}

// Cluster is what the API server says about this node's claims.
type Cluster interface {
	// AllocatedClaims lists the claims with a device allocated from a
	// pool of this node.
	AllocatedClaims(ctx context.Context) ([]*resourceapi.ResourceClaim, error)
}

// Reporter learns of each claim the plugin prepared afresh (not a
// repeated prepare of a prepared claim), once the kubelet's call has
// prepared all of its claims, to say so in the claim's status (the
// agent's GPU claim status writer). It must not block: the kubelet
// waits for the answer.
type Reporter[R any] interface {
	Prepared(claim *resourceapi.ResourceClaim, c Claim[R])
}

// Published is what the node publishes now (publish.Publisher): the last
// probed inventory and the slice features in use. A driver looks an
// allocated device up in it, not in the hardware of the moment.
type Published interface {
	Current() (hw.Inventory, device.Features)
}

// Options configure a Plugin.
type Options struct {
	DriverName string
	// StateDir holds the checkpoint ("<driver>.checkpoint.json").
	StateDir string
	// CDIDir is where claim CDI specs go; the container runtime reads it.
	CDIDir string
	// BootID of the running kernel; empty reads /proc.
	BootID string
	// Errors gets the kubelet plugin library's background errors; nil:
	// they are logged.
	Errors ErrorHandler
	// Cluster says which claims are allocated to this node's pools, for
	// Reclaim. Nil: there is no API server (the lab), and only prepared
	// claims hold hardware state.
	Cluster Cluster
	// ReclaimInterval is how often Reclaim runs again while it keeps
	// something (default 1 minute).
	ReclaimInterval time.Duration
}

// Plugin is a kubeletplugin.DRAPlugin over a Driver.
type Plugin[R any] struct {
	opts   Options
	driver Driver[R]

	// cp is the checkpoint as last written. Readers (Claims, Devices,
	// Prepared: the NRI hooks, which the runtime drops after 2 s) load it
	// and never wait for a write and its fsync.
	cp atomic.Pointer[Checkpoint[R]]
	// mu serialises checkpoint writes; each writes the next checkpoint
	// and only then publishes it.
	mu   sync.Mutex
	file writer

	claimLocks keyedlock.Locks
	cdi        *cdi.Cache
	// reporter learns of claims prepared (ReportTo); nil: nobody.
	reporter Reporter[R]
}

// ReportTo has r learn of every claim prepared from now on (Reporter).
// Call it before the plugin serves.
func (p *Plugin[R]) ReportTo(r Reporter[R]) { p.reporter = r }

// writer is where checkpoints go: a state.File, or in tests one that
// blocks.
type writer interface {
	Write(data []byte, durable bool) error
}

var _ kubeletplugin.DRAPlugin = (*Plugin[struct{}])(nil)

// New loads the checkpoint and reconciles it with the hardware and the CDI
// directory: claims left half-prepared are rolled back, hardware state and
// CDI specs that no prepared claim owns are removed. A checkpoint of an
// older version is migrated; one of a newer agent is left alone and this
// agent keeps its own beside it; an unreadable one is set aside and
// reported (state.Open). Without one the agent rebuilds its claims from
// their CDI specs: a crash loop would help nobody.
func New[R any](ctx context.Context, driver Driver[R], opts Options) (*Plugin[R], error) {
	logger := klog.FromContext(ctx)
	if opts.BootID == "" {
		opts.BootID = BootID()
	}
	if opts.ReclaimInterval == 0 {
		opts.ReclaimInterval = time.Minute
	}
	for _, dir := range []string{opts.StateDir, opts.CDIDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(opts.CDIDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI directory %s: %w", opts.CDIDir, err)
	}
	p := &Plugin[R]{opts: opts, driver: driver, cdi: cache}
	cp := &Checkpoint[R]{}
	file, found, err := state.Open(ctx, filepath.Join(opts.StateDir, opts.DriverName+".checkpoint.json"), state.CheckpointFormat,
		func(data []byte) error { return decodeCheckpoint(data, cp) },
		"rebuilding the prepared claims from their CDI specs")
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	p.file = file
	if !found {
		cp = &Checkpoint[R]{} // nothing read, or a half-read file set aside
	}
	if cp.Claims == nil {
		cp.Claims = map[types.UID]*Claim[R]{}
	}
	if cp.BootID != "" && cp.BootID != opts.BootID {
		// Rebooted: MIG instances, mediated devices and VF settings are
		// gone, and so are the CDI specs in /var/run. The kubelet prepares
		// running pods' claims again.
		logger.Info("Node rebooted since the checkpoint was written: forgetting its claims", "claims", len(cp.Claims))
		cp.Claims = map[types.UID]*Claim[R]{}
	}
	cp.BootID = opts.BootID
	if !found {
		// First start, or the state directory was lost: each prepared
		// claim's CDI spec holds its entry.
		if cp.Claims = p.claimsFromSpecs(ctx); len(cp.Claims) > 0 {
			logger.Info("Rebuilt the prepared claims from their CDI specs", "claims", len(cp.Claims))
		}
	}

	for uid, c := range cp.Claims {
		if c.State == StatePrepared {
			continue
		}
		logger.Info("Rolling back a claim left half-prepared", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
		if err := p.rollback(ctx, uid, c.Record); err != nil {
			// Kept, half-prepared: the kubelet's next prepare or
			// unprepare of the claim tries again. No crash loop.
			logger.Error(err, "Rolling back a half-prepared claim failed; it is retried when the kubelet next asks for the claim", "claim", klog.KRef(c.Namespace, c.Name))
			continue
		}
		delete(cp.Claims, uid)
	}
	p.mu.Lock()
	err = p.commit(cp)
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	owned := map[types.UID]R{}
	for uid, c := range cp.Claims {
		owned[uid] = c.Record
	}
	driver.Restore(ctx, owned)
	p.reclaim(ctx)
	if err := p.removeOrphanSpecs(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (p *Plugin[R]) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var fresh []*resourceapi.ResourceClaim
	for _, claim := range claims {
		devices, again, err := p.prepareClaim(ctx, claim)
		if err != nil {
			// Drivers name the request and field; the claim is named here.
			result[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)}
			continue
		}
		result[claim.UID] = kubeletplugin.PrepareResult{Devices: toKubelet(devices)}
		if !again {
			fresh = append(fresh, claim)
		}
	}
	p.report(fresh)
	return result, nil
}

// report tells the reporter of the claims prepared afresh, as the
// checkpoint has them.
func (p *Plugin[R]) report(claims []*resourceapi.ResourceClaim) {
	if p.reporter == nil || len(claims) == 0 {
		return
	}
	cp := p.cp.Load()
	for _, claim := range claims {
		if c := cp.Claims[claim.UID]; c != nil && c.State == StatePrepared {
			p.reporter.Prepared(claim, *c)
		}
	}
}

// prepareClaim prepares a claim; again: it was prepared already (the
// kubelet asks again), and the answer is the recorded one.
func (p *Plugin[R]) prepareClaim(ctx context.Context, claim *resourceapi.ResourceClaim) (devices []Device, again bool, err error) {
	unlock := p.claimLocks.Lock(string(claim.UID))
	defer unlock()

	prev := p.cp.Load().Claims[claim.UID]
	if prev != nil && prev.State == StatePrepared {
		// The kubelet retries: same answer, hardware untouched.
		return prev.Devices, true, nil
	}
	devices, err = p.prepareAfresh(ctx, claim, prev)
	return devices, false, err
}

// prepareAfresh prepares a claim not prepared (rolling back what an
// earlier attempt, prev, left).
func (p *Plugin[R]) prepareAfresh(ctx context.Context, claim *resourceapi.ResourceClaim, prev *Claim[R]) ([]Device, error) {
	if prev != nil {
		if err := p.rollback(ctx, claim.UID, prev.Record); err != nil {
			return nil, fmt.Errorf("roll back earlier attempt: %w", err)
		}
	}

	if err := refuseUnapplied(claim); err != nil {
		return nil, err
	}

	// Nothing is written until the driver saves its first intent: a
	// prepare without hardware side effects costs one checkpoint write,
	// and a crash before it leaves at most a CDI spec, which start-up
	// removes as an orphan.
	entry := Claim[R]{Namespace: claim.Namespace, Name: claim.Name, State: StatePreparing}
	stored := false
	save := func(r R) error {
		stored = true
		intent := entry
		intent.Record = r
		return p.store(claim.UID, &intent)
	}
	devices, record, err := p.driver.Prepare(ctx, claim, save)
	entry.Record = record
	if err == nil {
		err = p.writeSpec(claim.UID, entry, devices)
	}
	if err == nil {
		entry.State, entry.Devices = StatePrepared, devices
		err = p.store(claim.UID, &entry)
	}
	if err != nil {
		if rbErr := p.rollback(ctx, claim.UID, record); rbErr != nil {
			// Keep the record, in state Preparing: the next attempt or
			// start rolls it back again.
			entry.State = StatePreparing
			return nil, errors.Join(err, fmt.Errorf("rollback: %w", rbErr), p.store(claim.UID, &entry))
		}
		if !stored {
			return nil, err
		}
		return nil, errors.Join(err, p.store(claim.UID, nil))
	}
	return devices, nil
}

// refuseUnapplied refuses a claim with configurations that no driver
// reads (another vendor's driver, a typo such as gpu.hwdra.com): prepared
// with defaults it would run without what the user asked for (an
// exclusive GPU instead of MPS) and nothing would say so where the user
// looks; refused, the pod's events name the config and the likely fix
// (api.DriverHint). Every driver of the claim refuses it, before anything
// is written.
func refuseUnapplied(claim *resourceapi.ResourceClaim) error {
	var msgs []string
	for _, u := range api.UnappliedConfigs(claim) {
		msgs = append(msgs, u.String())
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("not prepared: %s", strings.Join(msgs, "; "))
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (p *Plugin[R]) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		if err := p.unprepareClaim(ctx, c.UID); err != nil {
			result[c.UID] = fmt.Errorf("claim %s: %w", c, err)
		} else {
			result[c.UID] = nil
		}
	}
	return result, nil
}

func (p *Plugin[R]) unprepareClaim(ctx context.Context, uid types.UID) error {
	unlock := p.claimLocks.Lock(string(uid))
	defer unlock()
	entry := p.cp.Load().Claims[uid]
	if entry == nil {
		return nil // never prepared here, or already unprepared
	}
	// The claim stays Prepared while its hardware is undone, CDI spec and
	// all: Unprepare is idempotent, and after a failure or a crash half-way
	// the kubelet calls it again (or prepares it again, for another pod,
	// and gets devices whose spec still exists).
	if err := p.driver.Unprepare(ctx, uid, entry.Record); err != nil {
		return err
	}
	if err := p.removeSpec(uid); err != nil {
		// The hardware is undone: no longer prepared, but a record to
		// finish with.
		undone := *entry
		undone.State = StatePreparing
		return errors.Join(err, p.store(uid, &undone))
	}
	return p.store(uid, nil)
}

// rollback undoes a claim's side effects and then its CDI spec: the spec
// goes only once nothing that a container could use is left.
func (p *Plugin[R]) rollback(ctx context.Context, uid types.UID, record R) error {
	if err := p.driver.Unprepare(ctx, uid, record); err != nil {
		return err
	}
	return p.removeSpec(uid)
}

// store puts a copy of a claim's entry (or, with nil, removes it) and
// writes the checkpoint.
func (p *Plugin[R]) store(uid types.UID, entry *Claim[R]) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur := p.cp.Load()
	next := &Checkpoint[R]{BootID: cur.BootID, Claims: maps.Clone(cur.Claims)}
	if entry == nil {
		delete(next.Claims, uid)
	} else {
		c := *entry
		next.Claims[uid] = &c
	}
	return p.commit(next)
}

// commit writes cp, durably (the one fsync of a prepare), and publishes
// it; a failed write publishes nothing. The caller holds mu.
func (p *Plugin[R]) commit(cp *Checkpoint[R]) error {
	data, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	if err := p.file.Write(data, true); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	p.cp.Store(cp)
	return nil
}

// HandleError implements kubeletplugin.DRAPlugin.
func (p *Plugin[R]) HandleError(ctx context.Context, err error, msg string) {
	if p.opts.Errors != nil {
		p.opts.Errors.HandleError(ctx, err, msg)
		return
	}
	klog.FromContext(ctx).Error(err, msg)
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin: a plugin alone
// knows nothing of device health; the agent serves the stream from its
// health monitors (internal/agent/health.go).
func (p *Plugin[R]) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// Prepared lists the prepared claims' UIDs, sorted.
func (p *Plugin[R]) Prepared() []types.UID {
	var out []types.UID
	for uid, c := range p.cp.Load().Claims {
		if c.State == StatePrepared {
			out = append(out, uid)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func toKubelet(devices []Device) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(devices))
	for _, d := range devices {
		out = append(out, d.Kubelet())
	}
	return out
}

// Kubelet is the device as the kubelet plugin library takes it, with its
// immediate metadata.
func (d Device) Kubelet() kubeletplugin.Device {
	kd := kubeletplugin.Device{
		Requests: d.Requests, PoolName: d.Pool, DeviceName: d.Device,
		CDIDeviceIDs: d.CDIDeviceIDs, ShareID: d.ShareID,
	}
	if d.Attributes != nil {
		kd.Metadata = &kubeletplugin.DeviceMetadata{Attributes: d.Attributes}
	}
	return kd
}

// Claims returns the prepared claims, by UID: copies, whose records
// share memory with the plugin's and must not be changed.
func (p *Plugin[R]) Claims() map[types.UID]Claim[R] {
	claims := p.cp.Load().Claims
	out := make(map[types.UID]Claim[R], len(claims))
	for uid, c := range claims {
		if c.State == StatePrepared {
			out[uid] = *c
		}
	}
	return out
}

// Devices are a prepared claim's devices (nil when it is not prepared).
func (p *Plugin[R]) Devices(uid types.UID) []Device {
	if c := p.cp.Load().Claims[uid]; c != nil && c.State == StatePrepared {
		return c.Devices
	}
	return nil
}
