// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/hwdra/hwdra/internal/mock/persist"
)

// GPU faults, as the driver shows them through NVML: event sets that
// deliver XID and other events, a GPU that falls off the bus (every
// lookup answers ERROR_GPU_IS_LOST), and the GPU recovery action field
// (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) that says what it takes to make
// the GPU usable again. go-nvml's mocks panic on all of these.

// applicationXIDs are the XIDs the driver blames on the program, not the
// GPU: after them it asks for no recovery action.
var applicationXIDs = []uint64{13, 31, 43, 45, 68, 109}

// xidFallenOffTheBus is the XID the driver logs when a GPU is lost.
const xidFallenOffTheBus = 79

// noInstance is the GPU/compute instance ID of an event not confined to
// one MIG instance.
const noInstance = 0xFFFFFFFF

// supportedEvents are the event types a mock GPU delivers.
const supportedEvents = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError |
	nvml.EventTypeSingleBitEccError | nvml.EventTypePState | nvml.EventTypeClock | nvml.EventTypeGpuUnavailableError)

// gpuHealth is one GPU's fault state. Guarded by mu, not the device lock:
// event delivery must not wait for a slow MIG call.
type gpuHealth struct {
	mu sync.Mutex
	// lost: fallen off the bus.
	lost bool
	// recovery is the recovery action field's value.
	recovery uint32
	// noRecoveryField: the driver does not report the field (older
	// drivers).
	noRecoveryField bool
	// sets the GPU is registered on, with the registered event types.
	sets []registration
	// stalled is closed when a stalled GPU answers again (nil: it
	// answers); held are the events it raised meanwhile, delivered then.
	stalled chan struct{}
	held    []setEvent
}

type registration struct {
	set  *eventSet
	mask uint64
}

// eventSet is an NVML event set: the GPUs registered on it queue their
// events in it, Wait takes them out.
type eventSet struct {
	*mock.EventSet
	events chan setEvent
	freed  atomic.Bool
}

// eventQueue is how many events a set queues (the driver's bound).
const eventQueue = 256

// setEvent is a queued event; lost marks "a GPU of the set is lost",
// which Wait answers with ERROR_GPU_IS_LOST.
type setEvent struct {
	data nvml.EventData
	lost bool
}

func newEventSet() *eventSet {
	s := &eventSet{EventSet: &mock.EventSet{}, events: make(chan setEvent, eventQueue)}
	s.WaitFunc = s.wait
	s.FreeFunc = func() nvml.Return {
		s.freed.Store(true)
		return nvml.SUCCESS
	}
	return s
}

func (s *eventSet) wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	if s.freed.Load() {
		return nvml.EventData{}, nvml.ERROR_INVALID_ARGUMENT
	}
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	select {
	case ev := <-s.events:
		if ev.lost {
			return nvml.EventData{}, nvml.ERROR_GPU_IS_LOST
		}
		return ev.data, nvml.SUCCESS
	case <-t.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

// push queues an event; a full queue drops it, as the driver's does.
func (s *eventSet) push(ev setEvent) {
	if s.freed.Load() {
		return
	}
	select {
	case s.events <- ev:
	default:
	}
}

// installHealth installs the event, lost-GPU and recovery-action
// behaviour of one GPU.
func (d *gpu) installHealth(noRecoveryField bool) {
	d.health.noRecoveryField = noRecoveryField
	sd := d.Device
	sd.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		if d.isLost() {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		mask := supportedEvents
		if !noRecoveryField {
			mask |= nvml.EventTypeGpuRecoveryAction
		}
		return mask, nvml.SUCCESS
	}
	sd.RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return {
		s, ok := set.(*eventSet)
		if !ok || s.freed.Load() {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if d.isLost() {
			return nvml.ERROR_GPU_IS_LOST
		}
		supported, _ := sd.GetSupportedEventTypesFunc()
		if types&^supported != 0 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		h := &d.health
		h.mu.Lock()
		defer h.mu.Unlock()
		h.sets = slices.DeleteFunc(h.sets, func(r registration) bool { return r.set.freed.Load() })
		h.sets = append(h.sets, registration{set: s, mask: types})
		return nvml.SUCCESS
	}
	sd.GetFieldValuesFunc = func(values []nvml.FieldValue) nvml.Return {
		if len(values) == 0 {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		d.awaitAnswer()
		h := &d.health
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.lost {
			return nvml.ERROR_GPU_IS_LOST
		}
		for i := range values {
			v := &values[i]
			if v.FieldId != nvml.FI_DEV_GET_GPU_RECOVERY_ACTION || h.noRecoveryField {
				v.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
				continue
			}
			v.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
			v.Value = [8]byte{}
			binary.NativeEndian.PutUint32(v.Value[:4], h.recovery)
			v.NvmlReturn = uint32(nvml.SUCCESS)
		}
		return nvml.SUCCESS
	}
	// A lost GPU answers nothing, to a handle it gave out before either.
	getPCI, getUUID := sd.GetPciInfoFunc, sd.GetUUIDFunc
	sd.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		if d.isLost() {
			return nvml.PciInfo{}, nvml.ERROR_GPU_IS_LOST
		}
		return getPCI()
	}
	sd.GetUUIDFunc = func() (string, nvml.Return) {
		if d.isLost() {
			return "", nvml.ERROR_GPU_IS_LOST
		}
		return getUUID()
	}
}

func (d *gpu) isLost() bool {
	d.health.mu.Lock()
	defer d.health.mu.Unlock()
	return d.health.lost
}

// emit delivers an event to every set the GPU is registered on for its
// type.
func (d *gpu) emit(ev setEvent) {
	h := &d.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stalled != nil {
		if len(h.held) < eventQueue { // as the driver's queue, full drops
			h.held = append(h.held, ev)
		}
		return
	}
	for _, r := range h.sets {
		if ev.lost || r.mask&ev.data.EventType != 0 {
			r.set.push(ev)
		}
	}
}

// xid raises an XID on the GPU, confined to a GPU instance (and compute
// instance) when gi (ci) is not noInstance. The driver asks for a GPU
// reset after any XID that is not the application's.
func (d *gpu) xid(code uint64, gi, ci uint32) error {
	h := &d.health
	h.mu.Lock()
	lost := h.lost
	if !lost && !slices.Contains(applicationXIDs, code) {
		h.recovery = max(h.recovery, uint32(nvml.GPU_RECOVERY_ACTION_GPU_RESET))
	}
	h.mu.Unlock()
	if lost {
		return fmt.Errorf("GPU %s is lost: it reports no XID until it is back", d.busID)
	}
	if gi != noInstance {
		if _, ret := d.GetGpuInstanceById(int(gi)); ret != nvml.SUCCESS {
			return fmt.Errorf("GPU %s has no GPU instance %d: %v", d.busID, gi, ret)
		}
	}
	d.changed(persist.CallXID, true)
	d.emit(setEvent{data: nvml.EventData{Device: d, EventType: nvml.EventTypeXidCriticalError, EventData: code,
		GpuInstanceId: gi, ComputeInstanceId: ci}})
	return nil
}

// fallOffTheBus loses the GPU: XID 79, then every lookup of it and every
// event wait answers ERROR_GPU_IS_LOST until clear.
func (d *gpu) fallOffTheBus() {
	d.emit(setEvent{data: nvml.EventData{Device: d, EventType: nvml.EventTypeXidCriticalError, EventData: xidFallenOffTheBus,
		GpuInstanceId: noInstance, ComputeInstanceId: noInstance}})
	h := &d.health
	h.mu.Lock()
	h.lost = true
	h.recovery = max(h.recovery, uint32(nvml.GPU_RECOVERY_ACTION_GPU_RESET))
	h.mu.Unlock()
	d.emit(setEvent{lost: true})
	d.changed(persist.CallGPULost, true)
}

// recover brings the GPU back as a reset would: on the bus, no recovery
// action asked for. The driver says so with a recovery-action event.
func (d *gpu) recover() {
	h := &d.health
	h.mu.Lock()
	h.lost = false
	h.recovery = uint32(nvml.GPU_RECOVERY_ACTION_NONE)
	h.mu.Unlock()
	d.changed(persist.CallClearGPU, true)
	d.emit(setEvent{data: nvml.EventData{Device: d, EventType: nvml.EventTypeGpuRecoveryAction,
		EventData: uint64(nvml.GPU_RECOVERY_ACTION_NONE), GpuInstanceId: noInstance, ComputeInstanceId: noInstance}})
}

// stall makes the GPU stop answering, as a GPU hung in the driver does:
// its health queries (field values: the recovery action) block and its
// events are held, until resume. The rest of NVML answers, so that a
// test sees the health monitor stall and nothing else; not persisted (a
// process started later finds the GPU answering).
func (d *gpu) stall() {
	h := &d.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stalled == nil {
		h.stalled = make(chan struct{})
	}
}

// resume makes a stalled GPU answer: the blocked queries return and the
// held events are delivered.
func (d *gpu) resume() {
	h := &d.health
	h.mu.Lock()
	stalled, held := h.stalled, h.held
	h.stalled, h.held = nil, nil
	h.mu.Unlock()
	if stalled != nil {
		close(stalled)
	}
	for _, ev := range held {
		d.emit(ev)
	}
}

// awaitAnswer blocks while the GPU is stalled.
func (d *gpu) awaitAnswer() {
	h := &d.health
	h.mu.Lock()
	stalled := h.stalled
	h.mu.Unlock()
	if stalled != nil {
		<-stalled
	}
}

// healthState and restoreHealth save and restore the fault state
// (persist.go).
func (d *gpu) healthState() (lost bool, recovery uint32) {
	h := &d.health
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost, h.recovery
}

func (d *gpu) restoreHealth(lost bool, recovery uint32) {
	h := &d.health
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lost, h.recovery = lost, recovery
}

// XID raises an XID on the GPU at a PCI address, confined to a GPU
// instance (and a compute instance in it) when gpuInstance (and
// computeInstance) are set. The driver asks for a GPU reset after any XID
// that is not the application's.
func (g *GPUs) XID(busID string, code uint64, gpuInstance, computeInstance *int) error {
	d, err := g.find(busID)
	if err != nil {
		return err
	}
	gi, ci := uint32(noInstance), uint32(noInstance)
	if gpuInstance != nil {
		gi = uint32(*gpuInstance)
	}
	if computeInstance != nil {
		if gpuInstance == nil {
			return errors.New("a compute instance needs its GPU instance")
		}
		ci = uint32(*computeInstance)
	}
	return d.xid(code, gi, ci)
}

// Stall makes the GPU at a PCI address stop answering its health
// queries and delivering events until Resume (gpu.stall).
func (g *GPUs) Stall(busID string) error { return g.on(busID, (*gpu).stall) }

// Resume makes a stalled GPU answer again and delivers the events it
// held.
func (g *GPUs) Resume(busID string) error { return g.on(busID, (*gpu).resume) }

// Lose makes the GPU at a PCI address fall off the bus: XID 79, then every
// NVML lookup of it answers ERROR_GPU_IS_LOST until Recover.
func (g *GPUs) Lose(busID string) error { return g.on(busID, (*gpu).fallOffTheBus) }

// Recover brings the GPU at a PCI address back as a reset would: on the
// bus, no recovery action asked for.
func (g *GPUs) Recover(busID string) error { return g.on(busID, (*gpu).recover) }

// on applies f to the GPU at a PCI address.
func (g *GPUs) on(busID string, f func(*gpu)) error {
	d, err := g.find(busID)
	if err == nil {
		f(d)
	}
	return err
}

// installLostLookups makes the server's lookups answer ERROR_GPU_IS_LOST
// for a lost GPU, as nvmlDeviceGetHandleBy* do.
func installLostLookups(s *server.Server) {
	lost := func(dev nvml.Device, ret nvml.Return) (nvml.Device, nvml.Return) {
		if ret == nvml.SUCCESS && dev.(*gpu).isLost() {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return dev, ret
	}
	byIndex, byUUID, byBus := s.DeviceGetHandleByIndexFunc, s.DeviceGetHandleByUUIDFunc, s.DeviceGetHandleByPciBusIdFunc
	s.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) { return lost(byIndex(i)) }
	s.DeviceGetHandleByUUIDFunc = func(id string) (nvml.Device, nvml.Return) { return lost(byUUID(id)) }
	s.DeviceGetHandleByPciBusIdFunc = func(id string) (nvml.Device, nvml.Return) { return lost(byBus(id)) }
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return newEventSet(), nvml.SUCCESS }
}
