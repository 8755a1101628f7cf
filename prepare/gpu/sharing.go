package gpu

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	gpuv1alpha1 "github.com/hwdra/hwdra/api/gpu/v1alpha1"
	"github.com/hwdra/hwdra/hw"
	"github.com/hwdra/hwdra/mps"
	"github.com/hwdra/hwdra/nvml"
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

// sharingPlan checks a device's sharing configuration against what the
// device can take (pure).
func sharingPlan(p *devicePlan, s *gpuv1alpha1.Sharing) error {
	if s == nil {
		return nil
	}
	strategy := field.NewPath("sharing", "strategy")
	switch p.dev.Kind {
	case device.KindVGPU:
		return field.Invalid(strategy, s.Strategy, "a vGPU takes no sharing strategy: the VM that runs it owns it")
	case device.KindPassthrough:
		return field.Invalid(strategy, s.Strategy, "a passthrough GPU takes no sharing strategy: the VM it is passed to owns it")
	case device.KindShare:
		return field.Invalid(strategy, s.Strategy, "a GPU share takes no sharing strategy: it runs under its GPU's MPS server, held to the memory and compute the scheduler counted")
	case device.KindMIG:
		if s.Strategy == gpuv1alpha1.TimeSlicing {
			return field.Invalid(strategy, s.Strategy, "the time slice is a setting of the whole GPU: a MIG partition takes MPS")
		}
	}
	if m := s.MPS; m != nil && m.DefaultPinnedDeviceMemoryLimit != nil {
		if have := p.memory(); uint64(m.DefaultPinnedDeviceMemoryLimit.Value()) > have {
			return field.Invalid(field.NewPath("sharing", "mps", "defaultPinnedDeviceMemoryLimit"), m.DefaultPinnedDeviceMemoryLimit.String(),
				fmt.Sprintf("more than the device's %d bytes of memory", have))
		}
	}
	p.sharing = s
	return nil
}

// shareLimits are what a GPU share consumed: its MPS client is held to
// them.
type shareLimits struct {
	memory  uint64 // bytes
	compute int    // percent of the GPU's multiprocessors
}

// sharePlan takes a GPU share's consumed capacity from its allocation
// and checks it against the GPU (the request policy keeps the scheduler
// within it; a share larger than the GPU is refused all the same).
func sharePlan(p *devicePlan, r resourceapi.DeviceRequestAllocationResult) error {
	if r.ShareID == nil {
		return errors.New("a GPU share allocated without a share ID (is DRAConsumableCapacity on in the scheduler?)")
	}
	path := field.NewPath("consumedCapacity")
	memory, compute := r.ConsumedCapacity[device.GPUCapMemory], r.ConsumedCapacity[device.GPUCapCompute]
	var errs field.ErrorList
	if v := compute.Value(); v < 1 || v > 100 {
		errs = append(errs, field.Invalid(path.Key(string(device.GPUCapCompute)), compute.String(), "must be 1 to 100 (percent of the GPU's multiprocessors)"))
	}
	if v := memory.Value(); v < 1 || uint64(v) > p.dev.GPU.MemoryBytes {
		errs = append(errs, field.Invalid(path.Key(string(device.GPUCapMemory)), memory.String(), fmt.Sprintf("must be at least 1 byte and at most the GPU's %d", p.dev.GPU.MemoryBytes)))
	}
	if len(errs) > 0 {
		return errs.ToAggregate()
	}
	p.share = &shareLimits{memory: uint64(memory.Value()), compute: int(compute.Value())}
	p.sharing = &gpuv1alpha1.Sharing{Strategy: gpuv1alpha1.MPS}
	return nil
}

// memory is the device's memory in bytes.
func (p *devicePlan) memory() uint64 {
	if p.dev.Kind == device.KindMIG {
		return p.dev.Profile.MemoryBytes
	}
	return p.dev.GPU.MemoryBytes
}

// usesMPS: the device runs under an MPS daemon.
func (p *devicePlan) usesMPS() bool {
	return p.sharing != nil && p.sharing.Strategy == gpuv1alpha1.MPS
}

// claimMPS checks that a claim's devices that run under MPS run under
// one daemon (a container reaches one daemon, through one pipe
// directory), with one configuration, and that the claim has no other
// GPU devices beside them (their processes would go through the daemon,
// which does not serve them).
func claimMPS(plans []devicePlan) error {
	for _, p := range plans {
		if p.share != nil && len(plans) > 1 {
			return fmt.Errorf("request %q: a claim with a GPU share has no other device (its containers reach one MPS daemon, held to the share's limits)", p.request)
		}
	}
	var first *devicePlan
	for i := range plans {
		p := &plans[i]
		if p.admin || !p.usesMPS() {
			continue
		}
		if first == nil {
			first = p
			continue
		}
		if !reflect.DeepEqual(first.sharing.MPS, p.sharing.MPS) {
			return fmt.Errorf("requests %q and %q: their MPS settings differ, and a claim's devices run under one MPS daemon", first.request, p.request)
		}
	}
	if first == nil {
		return nil
	}
	for _, p := range plans {
		if !p.admin && !p.usesMPS() {
			return fmt.Errorf("request %q: device %s does not run under MPS beside request %q's, which do: the claim's containers would reach it through the MPS daemon, which does not serve it",
				p.request, p.device, first.request)
		}
	}
	return nil
}

// claimDaemon is the MPS daemon of a claim's MPS devices, their UUIDs
// given (the MIG devices' are known once applied).
func claimDaemon(claim types.UID, plans []devicePlan, uuids []string) (mps.Spec, []int) {
	if len(plans) == 1 && plans[0].share != nil {
		// A GPU's shares run under the GPU's daemon, which gives no
		// defaults: each client is held to its own share.
		p := plans[0]
		s := mps.Spec{Owner: mps.OwnerShares, Devices: []string{uuids[0]}, Serves: []hw.PartitionRef{p.serves()}}
		s.ID = mps.ID(s.Owner, s.Devices)
		return s, []int{0}
	}
	var s mps.Spec
	var idx []int
	for i, p := range plans {
		if p.admin || !p.usesMPS() {
			continue
		}
		idx = append(idx, i)
		s.Devices = append(s.Devices, uuids[i])
		s.Serves = append(s.Serves, p.serves())
		if m := p.sharing.MPS; m != nil {
			s.ActiveThreadPercentage = m.DefaultActiveThreadPercentage
			if q := m.DefaultPinnedDeviceMemoryLimit; q != nil {
				v := uint64(q.Value())
				s.PinnedMemoryLimit = &v
			}
		}
	}
	s.Owner = string(claim)
	s.ID = mps.ID(s.Owner, s.Devices)
	return s, idx
}

// serves is the hardware the device is.
func (p *devicePlan) serves() hw.PartitionRef {
	ref := hw.PartitionRef{GPU: p.dev.GPU.PCIBusID}
	if at := p.dev.At(); at != nil {
		ref.Placement = *at
	}
	return ref
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

// settingsKey is the ledger key of a GPU's settings before the agent
// first changed them.
func settingsKey(gpu string) string { return "settings/" + gpu }

// recordSettings records what a GPU's settings were before a change, in
// the GPU's settings entry (kept from the first change on).
func (d *Driver) recordSettings(gpu string, set func(*ledgerEntry)) error {
	e, ok := d.ledger.Get(settingsKey(gpu))
	if !ok {
		e = ledgerEntry{GPU: gpu}
	}
	before := e
	set(&e)
	if ok && before == e {
		return nil
	}
	return d.ledger.Put(settingsKey(gpu), e)
}

// restoreSettings gives a GPU that no claim uses back the compute mode
// and time slice it had before the agent changed them. Like the MIG mode
// it is best effort, the entry kept (and tried again by Reclaim) until it
// succeeds: a setting left over costs the next claim only its timing,
// and failing unprepare for it would block the pod's teardown.
func (d *Driver) restoreSettings(ctx context.Context, gpu string) {
	e, ok := d.ledger.Get(settingsKey(gpu))
	if !ok {
		return
	}
	var err error
	if e.TimeSlice != nil {
		err = d.programs.SetTimeSlice(ctx, d.uuidOf(gpu), *e.TimeSlice)
	}
	if err == nil && e.ComputeMode != "" {
		err = d.nvml.SetComputeMode(gpu, e.ComputeMode)
	}
	if err == nil {
		err = d.ledger.Delete(settingsKey(gpu))
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Could not restore the GPU's compute mode and time slice; left as they are", "gpu", gpu)
	}
}

// uuidOf is a GPU's UUID from the last inventory.
func (d *Driver) uuidOf(gpu string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, g := range d.cat.gpus {
		if g.PCIBusID == gpu {
			return g.UUID
		}
	}
	return gpu // nvidia-smi -i takes a PCI address too
}

// useMPS records that a claim uses an MPS daemon.
func (d *Driver) useMPS(id string, claim types.UID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mpsUsers[id] == nil {
		d.mpsUsers[id] = map[types.UID]bool{}
	}
	d.mpsUsers[id][claim] = true
}

// releaseMPS records that a claim no longer uses an MPS daemon and
// stops the daemon when no claim does (and the driver knows all claims:
// until then Reclaim stops it).
func (d *Driver) releaseMPS(ctx context.Context, id string, claim types.UID) error {
	d.mu.Lock()
	delete(d.mpsUsers[id], claim)
	unused := d.reconciled && len(d.mpsUsers[id]) == 0
	if unused {
		delete(d.mpsUsers, id)
	}
	d.mu.Unlock()
	if !unused {
		return nil
	}
	return d.mps.Stop(ctx, id)
}

func isSettings(key string) bool { return strings.HasPrefix(key, "settings/") }

// restoredSettings is the settings entry a record of a lost ledger
// implies: the defaults, if the record changed a setting.
func restoredSettings(gpu string, s *SharingRecord) *ledgerEntry {
	if s.ComputeMode == "" && s.TimeSlice == nil {
		return nil
	}
	e := &ledgerEntry{GPU: gpu}
	if s.ComputeMode != "" {
		e.ComputeMode = nvml.ComputeDefault
	}
	if s.TimeSlice != nil {
		e.TimeSlice = new(int)
	}
	return e
}

// Keys of mayUse for MPS daemons: a claim allocated to the node may use
// its own daemon, and a GPU's allocated share its GPU's.
func mpsClaimKey(claim string) string { return "mps-claim/" + claim }
func mpsShareKey(gpu string) string   { return "mps-share/" + gpu }

// reclaimMPS stops the MPS daemons no prepared claim uses and no claim
// allocated to the node may use (everything is kept while that is not
// known); it returns those it keeps for a claim that is not prepared
// ("mps/<id>"). Each is judged under its GPUs' locks, against the live
// users.
func (d *Driver) reclaimMPS(ctx context.Context, known bool, mayUse map[string]bool) (kept []string, errs []error) {
	for _, id := range d.mps.IDs() {
		s, ok := d.mps.Spec(id)
		if !ok {
			continue
		}
		var gpus []string
		for _, ref := range s.Serves {
			gpus = append(gpus, ref.GPU)
		}
		unlock := d.gpuLocks.Lock(gpus...)
		d.mu.Lock()
		used := len(d.mpsUsers[id]) > 0
		d.mu.Unlock()
		may := mayUse[mpsClaimKey(s.Owner)]
		if s.Owner == mps.OwnerShares && len(gpus) > 0 {
			may = mayUse[mpsShareKey(gpus[0])]
		}
		switch {
		case used:
		case !known || may:
			kept = append(kept, "mps/"+id)
		default:
			klog.FromContext(ctx).Info("Stopping an MPS control daemon no claim uses", "daemon", id, "devices", s.Devices)
			if err := d.mps.Stop(ctx, id); err != nil {
				kept = append(kept, "mps/"+id)
				errs = append(errs, fmt.Errorf("MPS daemon %s: %w", id, err))
			}
		}
		unlock()
	}
	return kept, errs
}

// MPS is the driver's MPS daemons, for the health monitor.
func (d *Driver) MPS() *mps.Manager { return d.mps }
