// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/keyedlock"
	"github.com/hwdra/hwdra/internal/state"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/backend/vfiopci"
)

// Options configure a Driver.
type Options struct {
	// VFs reads and sets VF configuration (sriov.NetlinkVFConfigurator on
	// a host, the mock's VFRecorder in tests).
	VFs hw.VFConfigurator
	// Published is what the node publishes now: prepare looks devices up
	// in the PFs it offers (Config.Resolve) with the features in use.
	Published prepare.Published
	// Config decides which PFs are offered and how.
	Config *config.AgentConfig
	// SysfsRoot ("/sys") and DevRoot ("/dev") are the host's.
	SysfsRoot, DevRoot string
	// StateDir holds the ledger, "sriov.hwdra.io.ledger.json".
	StateDir string
	// NodeName is the node, and so the only pool prepare accepts.
	NodeName string
	// BootID of the running kernel; empty reads /proc.
	BootID string
	// Network is the NRI step that moves VF netdevs into pods; nil where
	// the runtime has no NRI (VFs stay in the host namespace).
	Network PodNetwork
}

// PodNetwork is the NRI step's side of a VF, as prepare needs it.
type PodNetwork interface {
	// Ready is nil while the container runtime's NRI connection is up:
	// without it a pod would start without its network.
	Ready() error
	// Release returns a VF (by PCI address) to the host if it is in a
	// pod, restoring its netdev's name, MTU, MAC, addresses and state,
	// and returns its netdev's name in the host ("" when it has none or
	// is unknown).
	Release(ctx context.Context, vfPCIAddress string) (netdev string, err error)
}

// Driver is the sriov.hwdra.io prepare.Driver.
type Driver struct {
	opts   Options
	ledger *state.Ledger[LedgerEntry]

	pfLocks keyedlock.Locks // by PF PCI address: plan, reserve, apply, restore

	mu   sync.Mutex
	held map[string]types.UID // VF PCI address -> claim holding it
	// noMinRate are the PFs (by PCI address) whose driver refused a VF
	// minimum rate: said once.
	noMinRate map[string]bool

	// hook, in tests, is called after each side effect ("ledger",
	// "configured"): a test crashes the prepare there.
	hook func(step string)
}

var _ prepare.Driver[Record] = (*Driver)(nil)

// LedgerFile is the ledger's name in the state directory.
const LedgerFile = device.NICDriver + ".ledger.json"

// New opens the ledger. Hand the Driver to prepare.New, which calls
// Reconcile before any prepare.
func New(opts Options) (*Driver, error) {
	if opts.VFs == nil || opts.Published == nil || opts.Config == nil || opts.StateDir == "" || opts.NodeName == "" {
		return nil, errors.New("nic: VFs, Published, Config, StateDir and NodeName are required")
	}
	if opts.SysfsRoot == "" {
		opts.SysfsRoot = sriov.DefaultSysfsRoot
	}
	if opts.DevRoot == "" {
		opts.DevRoot = "/dev"
	}
	if opts.BootID == "" {
		opts.BootID = prepare.BootID()
	}
	l, err := state.OpenLedger[LedgerEntry](filepath.Join(opts.StateDir, LedgerFile))
	if err != nil {
		return nil, fmt.Errorf("nic: %w", err)
	}
	return &Driver{opts: opts, ledger: l, held: map[string]types.UID{}, noMinRate: map[string]bool{}}, nil
}

// Prepare implements prepare.Driver: plan, reserve, then configure each VF.
func (d *Driver) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim, _ func(Record) error) ([]prepare.Device, Record, error) {
	var rec Record
	if d.opts.Network != nil && hasNICResult(claim) {
		if err := d.opts.Network.Ready(); err != nil {
			// A warning, not an error: the kubelet retries, and the
			// runtime's NRI usually comes back.
			klog.FromContext(ctx).Info("Warning: refusing to prepare the claim", "claim", klog.KObj(claim), "err", err)
			return nil, rec, err
		}
	}
	rec.Pods = reservedPods(claim)
	inv, features := d.opts.Published.Current()
	offers, _ := d.opts.Config.Resolve(inv.PFs)
	catalog := resources.NICDevices(offers, features)
	// Plan and reserve under the locks of every PF the claim uses, so that
	// concurrent claims on one PF never pick the same VF.
	defer d.pfLocks.Lock(claimPFs(claim, catalog)...)()
	plan, err := Plan(claim, catalog, d.heldCopy(), d.opts.NodeName, d.opts.Config)
	if err != nil {
		return nil, rec, err
	}
	if err := d.checkVFIO(plan); err != nil {
		return nil, rec, err
	}
	d.reserve(claim.UID, plan)
	devices := make([]prepare.Device, 0, len(plan))
	for _, a := range plan {
		dev, err := d.apply(claim.UID, a, &rec)
		if err != nil {
			return nil, rec, err
		}
		devices = append(devices, dev)
	}
	return devices, rec, nil
}

// checkVFIO refuses, before any VF is reserved, a VF bound to vfio-pci
// whose VFIO group has no IOMMU behind it, unless the configuration
// allows such groups (vfio.allowUnsafeNoIOMMU).
func (d *Driver) checkVFIO(plan []Assignment) error {
	for _, a := range plan {
		if a.Admin || a.VF.Driver != vfiopci.Driver {
			continue
		}
		g, err := sriov.VFIOGroup(d.opts.SysfsRoot, a.VF.PCIAddress)
		if err != nil {
			return fmt.Errorf("request %q: %w", a.Request, err)
		}
		group := vfiopci.Group{Node: strings.TrimPrefix(g.Path, "vfio/"), NoIOMMU: g.NoIOMMU}
		what := fmt.Sprintf("VF %s (VF %d of PF %s)", a.VF.PCIAddress, a.VF.Index, a.PF.PCIAddress)
		if err := vfiopci.RefuseNoIOMMU(what, group, d.opts.Config.AllowsUnsafeNoIOMMU()); err != nil {
			return fmt.Errorf("request %q: %w", a.Request, err)
		}
	}
	return nil
}

// apply configures one VF: read its original settings and what a
// container needs, record both, then change the hardware.
func (d *Driver) apply(uid types.UID, a Assignment, rec *Record) (prepare.Device, error) {
	dev := prepare.Device{Requests: []string{a.Request}, Pool: a.Pool, Device: a.Device, ShareID: a.ShareID}
	if a.Admin {
		dev.Attributes = nicMetadata(a).Attributes()
		return dev, nil
	}
	ref := hw.VFRef{PF: a.PF.Netdev, Index: a.VF.Index, Netdev: a.VF.Netdev}
	original, err := d.original(ref, a.VF.PCIAddress)
	if err != nil {
		return dev, fmt.Errorf("request %q: %w", a.Request, err)
	}
	applied := a.Config
	if a.KeepRate {
		applied.MinTxRateMbps, applied.MaxTxRateMbps = original.MinTxRateMbps, original.MaxTxRateMbps
	}
	// Device nodes are looked up before anything changes: a node without
	// them fails here at no cost.
	edits, md, err := d.describe(a, applied)
	if err != nil {
		return dev, fmt.Errorf("request %q: %w", a.Request, err)
	}
	dev.Edits, dev.Attributes = edits, md.Attributes()
	rec.VFs = append(rec.VFs, VF{
		Request: a.Request, Pool: a.Pool, Device: a.Device, ShareID: a.ShareID,
		PFAddress: a.PF.PCIAddress, PF: a.PF.Netdev, Index: a.VF.Index,
		PCIAddress: a.VF.PCIAddress, Netdev: a.VF.Netdev, RDMADevice: md.VF.RDMADevice,
		Original: original, Applied: applied, Network: a.Network,
	})
	// The ledger entry, written before the VF is touched, is what covers
	// a crash from here on (Reclaim restores the VF from it unless a claim
	// holds it or may): no checkpoint write, so a prepare costs one fsync.
	entry := LedgerEntry{Claim: uid, BootID: d.opts.BootID, PF: ref.PF, PFAddress: a.PF.PCIAddress, Index: ref.Index, Original: original}
	if err := d.ledger.Put(a.VF.PCIAddress, entry); err != nil {
		return dev, err
	}
	d.step("ledger")
	err = d.opts.VFs.SetVF(ref, applied)
	if errors.Is(err, unix.EOPNOTSUPP) && applied.MinTxRateMbps != 0 {
		// A driver that takes minimum rates refuses them on this PF
		// (takesMinRate: mlx5 firmware without eswitch bandwidth share,
		// ice with DCB on): the share is capped, not guaranteed.
		applied.MinTxRateMbps = 0
		if err = d.opts.VFs.SetVF(ref, applied); err == nil {
			d.minRateRefused(a.PF)
			rec.VFs[len(rec.VFs)-1].Applied = applied
			md.VF.Rates = &metadata.TxRates{MaxMbps: applied.MaxTxRateMbps}
			dev.Attributes = md.Attributes()
		}
	}
	if err != nil {
		return dev, fmt.Errorf("request %q: configuring VF %d of %s: %w", a.Request, a.VF.Index, pfName(a.PF), err)
	}
	d.step("configured")
	return dev, nil
}

// minRateRefused says, once per PF, that its driver refused a VF's
// minimum transmit rate, so its shares are capped and not guaranteed.
func (d *Driver) minRateRefused(pf hw.PF) {
	d.mu.Lock()
	first := !d.noMinRate[pf.PCIAddress]
	d.noMinRate[pf.PCIAddress] = true
	d.mu.Unlock()
	if first {
		klog.Warningf("PF %s (%s) refuses a VF's minimum transmit rate (EOPNOTSUPP): its bandwidth shares are capped at what they consumed but not guaranteed. "+
			"mlx5: the firmware lacks the eswitch bandwidth share; ice: DCB is on for the PF", pfName(pf), pf.Driver)
	}
}

// original is the VF's configuration before the agent touched it: the
// ledger's, if a restore failed earlier (the hardware then shows the
// agent's settings), else what the hardware reports.
func (d *Driver) original(ref hw.VFRef, addr string) (hw.VFConfig, error) {
	if e, ok := d.ledger.Get(addr); ok && e.BootID == d.opts.BootID {
		return e.Original, nil
	}
	cfg, err := d.opts.VFs.GetVF(ref)
	if err != nil {
		return cfg, fmt.Errorf("reading VF %d of %s: %w", ref.Index, ref.PF, err)
	}
	return cfg, nil
}

// Unprepare implements prepare.Driver: restore each recorded VF from its
// saved original and free it. A VF whose restore fails stays held (and in
// the ledger), and the error makes the plugin keep the record to retry.
func (d *Driver) Unprepare(ctx context.Context, uid types.UID, rec Record) error {
	var errs []error
	for i := len(rec.VFs) - 1; i >= 0; i-- {
		if err := d.restore(ctx, uid, rec.VFs[i]); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// Reserved but never recorded: the prepare failed before touching them.
	d.mu.Lock()
	for addr, owner := range d.held {
		if owner == uid {
			delete(d.held, addr)
		}
	}
	d.mu.Unlock()
	return nil
}

func (d *Driver) restore(ctx context.Context, uid types.UID, v VF) error {
	defer d.pfLocks.Lock(v.PFAddress)()
	if e, ok := d.ledger.Get(v.PCIAddress); ok && e.Claim != uid {
		// Another claim changed the VF since (this record is an old,
		// already undone attempt): its settings are not ours to undo.
		d.release(uid, v.PCIAddress)
		return nil
	}
	ref := d.currentRef(v.PCIAddress, v.PF, v.Index, v.Netdev)
	if d.opts.Network != nil {
		// Back from the pod first (also when no stop hook ever came):
		// its MTU and link state are set on the host's netdev.
		netdev, err := d.opts.Network.Release(ctx, v.PCIAddress)
		if err != nil {
			return fmt.Errorf("returning VF %d of %s (%s) from its pod: %w", v.Index, v.PF, v.PCIAddress, err)
		}
		if netdev != "" {
			ref.Netdev = netdev
		}
	}
	if err := d.opts.VFs.SetVF(ref, v.Original); err != nil {
		if !d.gone(ctx, v.PCIAddress, err) {
			return fmt.Errorf("restoring VF %d of %s (%s): %w", v.Index, v.PF, v.PCIAddress, err)
		}
	}
	if err := d.ledger.Delete(v.PCIAddress); err != nil {
		return err
	}
	d.release(uid, v.PCIAddress)
	return nil
}

// gone reports (and logs) that a VF whose restore failed no longer exists:
// its PF's VFs were disabled or its driver unloaded, and its settings went
// with it. Retrying could only fail forever.
func (d *Driver) gone(ctx context.Context, addr string, err error) bool {
	if _, _, serr := sriov.FunctionState(d.opts.SysfsRoot, addr); !errors.Is(serr, fs.ErrNotExist) {
		return false
	}
	klog.FromContext(ctx).Info("VF is gone: nothing to restore", "vf", addr, "err", err)
	return true
}

// currentRef addresses a VF as it is now: its netdev may have been
// renamed or moved away since it was prepared (a VF netdev returning from
// a destroyed pod namespace can come back under another name). Without a
// netdev in this namespace, MTU and link state are left as they are.
func (d *Driver) currentRef(addr, pf string, index int, netdev string) hw.VFRef {
	ref := hw.VFRef{PF: pf, Index: index, Netdev: netdev}
	if _, nd, err := sriov.FunctionState(d.opts.SysfsRoot, addr); err == nil {
		ref.Netdev = nd
	}
	return ref
}

func (d *Driver) heldCopy() map[string]types.UID {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.heldLocked()
}

func (d *Driver) heldLocked() map[string]types.UID {
	out := make(map[string]types.UID, len(d.held))
	for k, v := range d.held {
		out[k] = v
	}
	return out
}

func (d *Driver) reserve(uid types.UID, plan []Assignment) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, a := range plan {
		if !a.Admin {
			d.held[a.VF.PCIAddress] = uid
		}
	}
}

func (d *Driver) release(uid types.UID, addr string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.held[addr] == uid {
		delete(d.held, addr)
	}
}

// Held lists the VFs claims hold, by PCI address, sorted.
func (d *Driver) Held() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.held))
	for addr := range d.held {
		out = append(out, addr)
	}
	sort.Strings(out)
	return out
}

func (d *Driver) step(name string) {
	if d.hook != nil {
		d.hook(name)
	}
}

// hasNICResult: the claim has a device of this driver that is not for
// admin access (which gets no VF).
func hasNICResult(claim *resourceapi.ResourceClaim) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == device.NICDriver && (r.AdminAccess == nil || !*r.AdminAccess) {
			return true
		}
	}
	return false
}

// reservedPods are the UIDs of the pods a claim is reserved for.
func reservedPods(claim *resourceapi.ResourceClaim) []types.UID {
	var out []types.UID
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" {
			out = append(out, r.UID)
		}
	}
	return out
}

// claimPFs are the PCI addresses of the PFs behind the claim's devices.
func claimPFs(claim *resourceapi.ResourceClaim, catalog map[string]resources.NICDevice) []string {
	if claim.Status.Allocation == nil {
		return nil
	}
	var out []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if dev, ok := catalog[r.Device]; ok && r.Driver == device.NICDriver {
			out = append(out, dev.PF.PCIAddress)
		}
	}
	return out
}
