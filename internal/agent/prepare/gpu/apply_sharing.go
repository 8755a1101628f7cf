// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/hw"
)

// Sharing a device among the processes of the pods and containers that
// use a claim:
//
//   - TimeSlicing (whole GPUs): the GPU's compute mode is made Default
//     (any number of processes) and its time slice set through nvidia-smi.
//   - MPS (whole GPUs, MIG partitions): the claim's devices run under one
//     MPS control daemon of the claim, with the claim's defaults; a whole
//     GPU's compute mode is made ExclusiveProcess, so only the daemon's
//     server holds a context on it and every process goes through MPS.
//
//   - GPU shares (shareComputeMode): a policed share runs under the GPU's
//     daemon of its policed shares, a dedicated share under a daemon of
//     its own. The GPU is made ExclusiveProcess for its first policed
//     share and Default for a dedicated one: two daemons' servers cannot
//     both hold a context in ExclusiveProcess.
//
// A GPU's settings before the agent first changed them are in the ledger
// (settingsKey) and come back when no claim uses the GPU.
//
// Under gpus.settings Leave the agent changes no setting: plan refuses
// time-slicing, and MPS daemons (a claim's, a GPU's shares') serve the
// GPU in the compute mode it has; a share that would put a second daemon
// on a GPU in ExclusiveProcess is refused before anything is applied
// (sharesAsAllowed). A settings entry written before the switch to Leave
// is still restored when no claim uses the GPU: that undoes the agent's
// own change and gives the GPU back as the operator had it.

// share makes a whole GPU's settings what its sharing needs: time slicing
// sets its time slice, MPS makes it exclusive to the MPS server (the
// daemon itself starts once all of the claim's devices are there), a
// share as shareComputeMode says. A share's limits go into its record.
func (a *applier) share(ctx context.Context, r *DeviceRecord, p devicePlan) error {
	if p.sharing == nil {
		return nil
	}
	r.Sharing = &SharingRecord{}
	if sh := p.share; sh != nil {
		r.Sharing.Share = &ShareRecord{Memory: sh.memory, Compute: sh.compute, Dedicated: sh.dedicated}
	}
	if p.dev.Kind != device.KindGPU && p.dev.Kind != device.KindShare {
		return nil // a MIG partition's GPU is others' too
	}
	if p.usesMPS() && a.d.leave {
		return a.d.tellMPSMode(ctx, r.GPU)
	}
	if p.share != nil {
		return a.shareComputeMode(ctx, r, p)
	}
	if p.usesMPS() {
		return a.computeMode(r, nvml.ComputeExclusiveProcess)
	}
	return a.timeSlice(ctx, r, p)
}

// shareComputeMode sets the compute mode of a share's GPU under
// gpus.settings Manage, before the share's daemon starts:
//
//   - A dedicated share, and a policed share where a dedicated share's
//     daemon is on the GPU, make it Default: the daemons' servers each
//     hold a context, which ExclusiveProcess allows only one of. A
//     dedicated share that comes to a GPU whose policed shares' daemon
//     runs in ExclusiveProcess switches it to Default; that server keeps
//     the context it holds.
//   - The GPU's first share, policed, makes it ExclusiveProcess: only the
//     daemon's server holds a context, every process goes through MPS.
//   - A policed share beside other shares leaves the mode as it is:
//     ExclusiveProcess, or Default where a dedicated share was. When the
//     last dedicated share goes and policed shares remain, the GPU stays
//     in Default until no claim uses it (the ledger then restores the mode
//     it had): no switch is made under a running server.
func (a *applier) shareComputeMode(ctx context.Context, r *DeviceRecord, p devicePlan) error {
	switch {
	case p.share.dedicated || a.d.dedicatedDaemonOn(r.GPU):
		if err := a.computeMode(r, nvml.ComputeDefault); err != nil {
			return err
		}
		a.d.tellDedicatedMode(ctx, r.GPU)
		return nil
	case a.d.usedByOthers(r.GPU, a.claim):
		return nil
	}
	return a.computeMode(r, nvml.ComputeExclusiveProcess)
}

// dedicatedDaemonOn tells whether a dedicated share's daemon is recorded
// on a GPU (running, or to be stopped): while it is, the GPU stays in
// compute mode Default. The caller holds the GPU's lock.
func (d *Driver) dedicatedDaemonOn(gpu string) bool {
	for _, s := range d.daemonsOn(gpu) {
		if s.Share {
			return true
		}
	}
	return false
}

// daemonsOn are the MPS daemons recorded as serving a GPU (or a MIG
// partition of it).
func (d *Driver) daemonsOn(gpu string) []mps.Spec {
	var out []mps.Spec
	for _, id := range d.mps.IDs() {
		s, ok := d.mps.Spec(id)
		if ok && slices.ContainsFunc(s.Serves, func(ref hw.PartitionRef) bool { return ref.GPU == gpu }) {
			out = append(out, s)
		}
	}
	return out
}

// usedByOthers tells whether a claim other than this one uses the GPU.
func (d *Driver) usedByOthers(gpu string, claim types.UID) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for uid := range d.users[gpu] {
		if uid != claim {
			return true
		}
	}
	return false
}

// tellDedicatedMode says in the log, once per GPU, what compute mode
// Default, which a dedicated share needs, costs.
func (d *Driver) tellDedicatedMode(ctx context.Context, gpu string) {
	if !d.tellOnce(gpu) {
		return
	}
	klog.FromContext(ctx).Info("A dedicated GPU share runs the GPU in compute mode Default: two MPS daemons' servers cannot both hold a context in ExclusiveProcess. "+
		"In Default a process of a pod that bypasses MPS (its own CUDA_MPS_PIPE_DIRECTORY) gets a context of its own on the whole GPU, all of its multiprocessors and as much memory as is free, "+
		"outside every share's limits; the policing of shares watches for such processes. The GPU stays in Default until no claim uses it",
		"gpu", gpu)
}

// tellOnce reports whether the log has not yet explained a GPU's compute
// mode, and marks it explained.
func (d *Driver) tellOnce(gpu string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	told := d.toldMPSMode[gpu]
	d.toldMPSMode[gpu] = true
	return !told
}

// sharesAsAllowed checks, under gpus.settings Leave and before anything
// is applied, that no share would put a second MPS daemon on a GPU in
// compute mode ExclusiveProcess, where only one server can hold a
// context: a dedicated share where any other daemon serves the GPU, a
// policed share where a daemon other than the GPU's policed shares' does
// (a dedicated share's). The agent does not make the GPU Default under
// Leave, so such a share is refused, naming the GPU, its mode, the
// setting and what to do. A share alone on its GPU is fine in any mode.
func (a *applier) sharesAsAllowed(plans []devicePlan) error {
	if !a.d.leave {
		return nil
	}
	for _, p := range plans {
		if p.share == nil || p.admin {
			continue
		}
		gpu := p.dev.PCIBusID()
		own, _ := claimDaemon(a.claim, []devicePlan{p}, []string{p.dev.GPU.UUID})
		var other *mps.Spec
		for _, s := range a.d.daemonsOn(gpu) {
			if s.ID != own.ID {
				other = &s
				break
			}
		}
		if other == nil {
			continue
		}
		mode, err := a.d.nvml.ComputeMode(gpu)
		if err != nil {
			return fmt.Errorf("request %q, device %s: %w", p.request, p.device, err)
		}
		if mode != nvml.ComputeExclusiveProcess {
			continue
		}
		what := "a dedicated share runs under an MPS daemon of its own"
		if !p.share.dedicated {
			what = "the GPU's policed shares run under an MPS daemon of their own"
		}
		instead := "wait for that daemon's claim to go"
		if other.Owner == mps.OwnerShares {
			instead = "take a policed share (class share.gpu.hwdra.io, or share.isolation Policed)"
		}
		return fmt.Errorf("request %q, device %s: refused: %s, and GPU %s is in compute mode %s, where only one MPS server can hold a context, and MPS daemon %s (%s) already serves it; "+
			"the agent's configuration says gpus.settings: Leave, so it does not make the GPU Default: set the GPU's compute mode to Default with the tool that owns it, %s, or configure the agent with gpus.settings: Manage",
			p.request, p.device, what, gpu, mode, other.ID, daemonOf(*other), instead)
	}
	return nil
}

// daemonOf says whose a daemon is, for people.
func daemonOf(s mps.Spec) string {
	switch {
	case s.Owner == mps.OwnerShares:
		return "the GPU's policed shares"
	case s.Share:
		return "claim " + s.Owner + "'s dedicated share"
	}
	return "claim " + s.Owner + "'s MPS devices"
}

// tellMPSMode says in the log, once per GPU, what MPS on a GPU in compute
// mode Default costs where gpus.settings Leave keeps the agent from making
// it ExclusiveProcess: the daemon's limits hold only the processes that
// reach it. It only reads the GPU.
func (d *Driver) tellMPSMode(ctx context.Context, gpu string) error {
	mode, err := d.nvml.ComputeMode(gpu)
	if err != nil || mode != nvml.ComputeDefault {
		return err
	}
	if d.tellOnce(gpu) {
		klog.FromContext(ctx).Info("MPS serves a GPU in compute mode Default, which gpus.settings Leave keeps the agent from making ExclusiveProcess: "+
			"a process of a pod that bypasses the MPS daemon (its own CUDA_MPS_PIPE_DIRECTORY) gets a context of its own on the whole GPU, all of its multiprocessors and as much memory as is free, "+
			"outside the limits of every MPS client; ExclusiveProcess, set by whoever owns the GPU's settings, keeps such a context out",
			"gpu", gpu, "computeMode", mode)
	}
	return nil
}

// startClaimMPS starts the MPS daemon of the claim's MPS devices, if it
// has any, and gives their containers its pipe, shared memory and limits.
func (a *applier) startClaimMPS(ctx context.Context, plans []devicePlan, devices []prepare.Device) error {
	s, idx := claimDaemon(a.claim, plans, a.uuids)
	if len(idx) == 0 {
		return nil
	}
	records := make([]int, len(idx))
	edits := make([]*cdispec.ContainerEdits, len(idx))
	for k, i := range idx {
		records[k], edits[k] = a.records[i], devices[i].Edits
	}
	limits := func(k int) mps.Limits {
		if sh := plans[idx[k]].share; sh != nil {
			return mps.Limits{ActiveThreadPercentage: &sh.compute, PinnedMemoryLimit: &sh.memory}
		}
		return mps.Limits{ActiveThreadPercentage: s.ActiveThreadPercentage, PinnedMemoryLimit: s.PinnedMemoryLimit}
	}
	if err := a.startMPS(ctx, s, records, limits, edits); err != nil {
		if s.Share {
			return fmt.Errorf("the dedicated share's MPS daemon: %w", err)
		}
		return fmt.Errorf("the claim's MPS daemon: %w", err)
	}
	return nil
}

// startMPS runs the claim's devices under their daemon: it is recorded
// in each device's record and as the claim's use before it starts, so
// that a failure anywhere is undone by Unprepare. Each device's edits get
// the daemon's pipe and shared memory and its limits.
// records are the devices' records, out their edits, limits(k) device
// k's limits.
func (a *applier) startMPS(ctx context.Context, s mps.Spec, records []int, limits func(k int) mps.Limits, out []*cdispec.ContainerEdits) error {
	for _, i := range records {
		a.rec.Devices[i].Sharing.MPS = s.ID
	}
	a.d.useMPS(s.ID, a.claim)
	if err := a.d.mps.Start(ctx, s); err != nil {
		return err
	}
	if err := a.d.effect("mps"); err != nil {
		return err
	}
	dirs := a.d.mps.Dirs(s.ID)
	for k := range records {
		e := s.ClientEdits(dirs, limits(k))
		out[k].Env = append(out[k].Env, e.Env...)
		out[k].Mounts = append(out[k].Mounts, e.Mounts...)
	}
	return nil
}

// timeSlice time-slices a whole GPU at the configured interval.
func (a *applier) timeSlice(ctx context.Context, r *DeviceRecord, p devicePlan) error {
	n := p.sharing.TimeSlicing.Interval.Index()
	if err := a.computeMode(r, nvml.ComputeDefault); err != nil {
		return err
	}
	if err := a.d.recordSettings(r.GPU, func(e *ledgerEntry) {
		if e.TimeSlice == nil {
			// nvidia-smi does not tell the time slice back: the one
			// before is taken to be the default, which only the agent
			// changes.
			e.TimeSlice = new(int)
		}
	}); err != nil {
		return err
	}
	r.Sharing.TimeSlice = &n
	if err := a.d.programs.SetTimeSlice(ctx, p.dev.GPU.UUID, n); err != nil {
		return err
	}
	return a.d.effect("time-slice")
}

// computeMode sets a whole GPU's compute mode, the one before recorded
// first.
func (a *applier) computeMode(r *DeviceRecord, want nvml.ComputeMode) error {
	cur, err := a.d.nvml.ComputeMode(r.GPU)
	if err != nil || cur == want {
		return err
	}
	if err := a.d.recordSettings(r.GPU, func(e *ledgerEntry) {
		if e.ComputeMode == "" {
			e.ComputeMode = cur
		}
	}); err != nil {
		return err
	}
	r.Sharing.ComputeMode = want
	if err := a.d.nvml.SetComputeMode(r.GPU, want); err != nil {
		return err
	}
	return a.d.effect("compute-mode")
}
