// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
)

// healthEvents are the NVML events the health monitor listens for, where a
// GPU supports them. Single-bit ECC errors are corrected and left out.
const healthEvents = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError |
	nvml.EventTypeGpuUnavailableError | nvml.EventTypeGpuRecoveryAction)

// noInstance is an event's GpuInstanceId when it is not confined to one
// MIG GPU instance.
const noInstance = 0xFFFFFFFF

// eventWait bounds one nvmlEventSetWait, so that Shutdown (which waits for
// calls in flight) and a cancelled watch never wait longer.
const eventWait = 500 * time.Millisecond

// ErrNoEvents is returned by WatchEvents when no GPU can deliver health
// events: the monitor then relies on its periodic checks.
var ErrNoEvents = errors.New("no GPU delivers health events")

// WatchEvents registers one NVML event set on every GPU for XID errors,
// double-bit ECC errors, GPU-unavailable and recovery-action events (those
// each GPU supports) and sends them to out until ctx ends; then it frees
// the set and returns nil. A GPU that cannot be registered (lost, say) is
// left out and named in the error of a later return; restart the watch to
// include a GPU that came back.
func (b *Backend) WatchEvents(ctx context.Context, out chan<- hw.GPUEvent) error {
	set, devs, armErr := b.armEvents()
	if set == nil {
		return armErr
	}
	defer b.freeEvents(set)
	for ctx.Err() == nil {
		ev, ok, err := b.waitEvent(set, devs)
		if err != nil {
			return errors.Join(armErr, err)
		}
		if !ok {
			continue
		}
		select {
		case out <- ev:
		case <-ctx.Done():
		}
		if ev.Kind == hw.GPUEventUnavailable && ev.PCIBusID == "" {
			// The wait answers "lost" until the GPU is back: do not spin.
			select {
			case <-time.After(eventWait):
			case <-ctx.Done():
			}
		}
	}
	return nil
}

// armEvents creates the set and registers every GPU it can. It returns a
// nil set when none could be registered.
func (b *Backend) armEvents() (nvml.EventSet, map[nvml.Device]string, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	count, err := b.deviceCount()
	if err != nil {
		return nil, nil, err
	}
	set, ret := b.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("EventSetCreate: %w", ret)
	}
	devs := map[nvml.Device]string{}
	var errs []error
	for i := 0; i < count; i++ {
		dev, ret := b.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			errs = append(errs, fmt.Errorf("GPU %d: DeviceGetHandleByIndex: %w", i, ret))
			continue
		}
		ref := gpuRef{index: i}
		busID, err := deviceBusID(dev)
		if err != nil {
			errs = append(errs, ref.err("GetPciInfo", err.(nvml.Return)))
			continue
		}
		ref.busID = busID
		supported, ret := dev.GetSupportedEventTypes()
		if ok, err := ref.optional("GetSupportedEventTypes", ret); err != nil {
			errs = append(errs, err)
			continue
		} else if !ok || supported&healthEvents == 0 {
			continue
		}
		ret = dev.RegisterEvents(supported&healthEvents, set)
		if ok, err := ref.optional("RegisterEvents", ret); err != nil {
			errs = append(errs, err)
			continue
		} else if !ok {
			continue
		}
		devs[dev] = busID
	}
	if len(devs) == 0 {
		_ = set.Free() // the error returned says what went wrong
		return nil, nil, errors.Join(append(errs, ErrNoEvents)...)
	}
	return set, devs, errors.Join(errs...)
}

func (b *Backend) freeEvents(set nvml.EventSet) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.ready() == nil {
		_ = set.Free() // stopping: nothing more to do if the driver refuses
	}
}

// waitEvent waits for one event; ok is false when none came in time.
func (b *Backend) waitEvent(set nvml.EventSet, devs map[nvml.Device]string) (hw.GPUEvent, bool, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if err := b.ready(); err != nil {
		return hw.GPUEvent{}, false, err
	}
	data, ret := set.Wait(uint32(eventWait / time.Millisecond))
	now := time.Now()
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_TIMEOUT:
		return hw.GPUEvent{}, false, nil
	case nvml.ERROR_GPU_IS_LOST:
		// Some GPU of the set fell off the bus; the wait does not say which.
		return hw.GPUEvent{Kind: hw.GPUEventUnavailable, Time: now}, true, nil
	default:
		return hw.GPUEvent{}, false, fmt.Errorf("EventSetWait: %w", ret)
	}
	ev := hw.GPUEvent{Time: now}
	busID, known := devs[data.Device]
	if !known {
		busID, _ = deviceBusID(data.Device)
	}
	ev.PCIBusID = busID
	switch {
	case data.EventType&nvml.EventTypeXidCriticalError != 0:
		ev.Kind, ev.XID = hw.GPUEventXID, data.EventData
	case data.EventType&nvml.EventTypeDoubleBitEccError != 0:
		ev.Kind = hw.GPUEventDoubleBitECC
	case data.EventType&nvml.EventTypeGpuUnavailableError != 0:
		ev.Kind = hw.GPUEventUnavailable
	case data.EventType&nvml.EventTypeGpuRecoveryAction != 0:
		ev.Kind = hw.GPUEventRecoveryAction
	default:
		return hw.GPUEvent{}, false, nil // not asked for
	}
	if data.Device == nil {
		return ev, true, nil
	}
	if data.GpuInstanceId != noInstance && ev.Kind != hw.GPUEventUnavailable {
		// Where the instance cannot be read (destroyed since), the event
		// counts for the whole GPU: better too much than too little.
		if gi, ret := data.Device.GetGpuInstanceById(int(data.GpuInstanceId)); ret == nvml.SUCCESS {
			if info, ret := gi.GetInfo(); ret == nvml.SUCCESS {
				ev.Partition = &hw.Placement{Start: int(info.Placement.Start), Size: int(info.Placement.Size)}
			}
		}
	}
	ev.RecoveryAction, _ = recoveryAction(data.Device)
	return ev, true, nil
}

// CheckGPUs asks every GPU whether it still answers and what recovery
// action its driver asks for. Only a failure of the node-wide count fails
// the call.
func (b *Backend) CheckGPUs(ctx context.Context) ([]hw.GPUCheck, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	count, err := b.deviceCount()
	if err != nil {
		return nil, err
	}
	out := make([]hw.GPUCheck, 0, count)
	for i := 0; i < count; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c := hw.GPUCheck{Index: i}
		dev, ret := b.lib.DeviceGetHandleByIndex(i)
		if ret == nvml.SUCCESS {
			var err error
			if c.PCIBusID, err = deviceBusID(dev); err != nil {
				ret = err.(nvml.Return)
			}
		}
		if ret == nvml.SUCCESS {
			c.RecoveryAction, ret = recoveryAction(dev)
		}
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_GPU_IS_LOST:
			c.Lost = true
		default:
			c.Error = fmt.Sprintf("GPU %d: %v", i, ret)
		}
		out = append(out, c)
	}
	return out, nil
}

// deviceBusID is a device's canonical PCI address; the error is NVML's
// Return.
func deviceBusID(dev nvml.Device) (string, error) {
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return "", ret
	}
	id, err := busIDFromPCI(pci)
	if err != nil {
		return "", nvml.ERROR_UNKNOWN
	}
	return id, nil
}

// recoveryAction reads NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: nil (and
// SUCCESS) where the driver does not report it; ret is the device's answer
// to the query itself (ERROR_GPU_IS_LOST, say).
func recoveryAction(dev nvml.Device) (*hw.GPURecoveryAction, nvml.Return) {
	vals := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	ret := dev.GetFieldValues(vals)
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND:
		return nil, nvml.SUCCESS
	case ret != nvml.SUCCESS:
		return nil, ret
	case nvml.Return(vals[0].NvmlReturn) != nvml.SUCCESS:
		return nil, nvml.SUCCESS // this field is unknown to the driver
	}
	v := vals[0].Value
	var n uint64
	switch nvml.ValueType(vals[0].ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		n = binary.NativeEndian.Uint64(v[:])
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		n = uint64(binary.NativeEndian.Uint16(v[:2]))
	default:
		n = uint64(binary.NativeEndian.Uint32(v[:4]))
	}
	a := hw.GPURecoveryAction(n)
	return &a, nvml.SUCCESS
}
