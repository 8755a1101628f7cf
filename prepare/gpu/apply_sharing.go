package gpu

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/mps"
	"github.com/hwdra/hwdra/nvml"
	"github.com/hwdra/hwdra/prepare"
	"github.com/hwdra/hwdra/slices/device"
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
// A GPU's settings before the agent first changed them are in the ledger
// (settingsKey) and come back when no claim uses the GPU.
//
// Under gpus.settings Leave the agent changes no setting: plan refuses
// time-slicing, and MPS daemons (a claim's, a GPU's shares') serve the
// GPU in the compute mode it has. A settings entry written before the
// switch to Leave is still restored when no claim uses the GPU: that
// undoes the agent's own change and gives the GPU back as the operator
// had it.

// share makes a whole GPU's settings what its sharing needs: time slicing
// sets its time slice, MPS makes it exclusive to the MPS server (the
// daemon itself starts once all of the claim's devices are there).
func (a *applier) share(ctx context.Context, r *DeviceRecord, p devicePlan) error {
	if p.sharing == nil {
		return nil
	}
	r.Sharing = &SharingRecord{}
	if p.dev.Kind != device.KindGPU && p.dev.Kind != device.KindShare {
		return nil // a MIG partition's GPU is others' too
	}
	if p.usesMPS() && a.d.leave {
		return a.d.tellMPSMode(ctx, r.GPU)
	}
	if p.usesMPS() {
		return a.computeMode(r, nvml.ComputeExclusiveProcess)
	}
	return a.timeSlice(ctx, r, p)
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
	d.mu.Lock()
	told := d.toldMPSMode[gpu]
	d.toldMPSMode[gpu] = true
	d.mu.Unlock()
	if !told {
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
