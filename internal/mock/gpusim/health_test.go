// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// waitEvent waits on a set as a health monitor does.
func waitEvent(t *testing.T, lib nvml.Interface, set nvml.EventSet) (nvml.EventData, nvml.Return) {
	t.Helper()
	return lib.EventSetWait(set, 2000)
}

func recoveryField(t *testing.T, dev nvml.Device) (uint32, nvml.Return) {
	t.Helper()
	v := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := dev.GetFieldValues(v); ret != nvml.SUCCESS {
		return 0, ret
	}
	if r := nvml.Return(v[0].NvmlReturn); r != nvml.SUCCESS {
		return 0, r
	}
	return binary.NativeEndian.Uint32(v[0].Value[:4]), nvml.SUCCESS
}

// TestGPUEvents: XIDs reach the event sets the GPU is registered on, with
// the GPU instance they are confined to; the driver asks for a reset after
// a device XID and not after an application XID.
func TestGPUEvents(t *testing.T) {
	h := build(t, `gpus: [{model: h100-80gb, count: 2, mig: true, migInstances: [{profile: 3g.40gb, start: 4}]}]`)
	lib := h.NVML
	lib.Init()
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	defer lib.EventSetFree(set)
	d0, _ := lib.DeviceGetHandleByIndex(0)
	d1, _ := lib.DeviceGetHandleByIndex(1)
	supported, ret := d0.GetSupportedEventTypes()
	if ret != nvml.SUCCESS || supported&nvml.EventTypeXidCriticalError == 0 || supported&nvml.EventTypeGpuRecoveryAction == 0 {
		t.Fatalf("supported events %#x %v", supported, ret)
	}
	if ret := d0.RegisterEvents(nvml.EventTypeXidCriticalError|nvml.EventTypeGpuRecoveryAction, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := d0.RegisterEvents(1<<40, set); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("registering an unsupported type: %v", ret)
	}
	// Not registered: d1's XIDs do not reach the set.
	if err := h.XID("0000:43:00.0", 48, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, ret := lib.EventSetWait(set, 50); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("event from an unregistered GPU: %v", ret)
	}
	if a, _ := recoveryField(t, d1); a != uint32(nvml.GPU_RECOVERY_ACTION_GPU_RESET) {
		t.Errorf("recovery action after XID 48: %d", a)
	}

	if err := h.XID("0000:1b:00.0", 13, nil, nil); err != nil {
		t.Fatal(err)
	}
	ev, ret := waitEvent(t, lib, set)
	if ret != nvml.SUCCESS || ev.EventData != 13 || ev.Device != d0 || ev.GpuInstanceId != noInstance {
		t.Fatalf("XID 13: %+v %v", ev, ret)
	}
	if a, _ := recoveryField(t, d0); a != 0 {
		t.Errorf("recovery action after application XID 13: %d", a)
	}
	giInfo := func() nvml.GpuInstanceInfo {
		prof, _ := d0.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_3_SLICE)
		list, _ := d0.GetGpuInstances(&prof)
		if len(list) != 1 {
			t.Fatalf("GPU instances %v", list)
		}
		info, _ := list[0].GetInfo()
		return info
	}()
	gi := int(giInfo.Id)
	if err := h.XID("0000:1b:00.0", 94, &gi, nil); err != nil {
		t.Fatal(err)
	}
	ev, _ = waitEvent(t, lib, set)
	if ev.EventData != 94 || ev.GpuInstanceId != uint32(gi) || ev.ComputeInstanceId != noInstance {
		t.Fatalf("XID 94 in GI %d: %+v", gi, ev)
	}
	missing := 5
	if err := h.XID("0000:1b:00.0", 94, &missing, nil); err == nil || !strings.Contains(err.Error(), "no GPU instance 5") {
		t.Errorf("XID in a GPU instance that does not exist: %v", err)
	}
	if err := h.XID("0000:99:00.0", 1, nil, nil); err == nil || !strings.Contains(err.Error(), "no GPU 0000:99:00.0") {
		t.Errorf("XID on a GPU that does not exist: %v", err)
	}
}

// TestGPULostAndBack: a lost GPU answers ERROR_GPU_IS_LOST to every
// lookup and event wait, after an XID 79; cleared, it answers again and
// the driver reports that no recovery action is needed.
func TestGPULostAndBack(t *testing.T) {
	h := build(t, `gpus: [{model: h100-80gb, count: 2}]`)
	lib := h.NVML
	lib.Init()
	set, _ := lib.EventSetCreate()
	d0, _ := lib.DeviceGetHandleByIndex(0)
	d0.RegisterEvents(nvml.EventTypeXidCriticalError|nvml.EventTypeGpuRecoveryAction, set)
	uuid, _ := d0.GetUUID()

	if err := h.Lose("0000:1b:00.0"); err != nil {
		t.Fatal(err)
	}
	if ev, ret := waitEvent(t, lib, set); ret != nvml.SUCCESS || ev.EventData != 79 {
		t.Fatalf("first event after the loss: %+v %v, want XID 79", ev, ret)
	}
	if _, ret := waitEvent(t, lib, set); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("second wait: %v, want ERROR_GPU_IS_LOST", ret)
	}
	for name, ret := range map[string]nvml.Return{
		"by index": second(lib.DeviceGetHandleByIndex(0)),
		"by bus":   second(lib.DeviceGetHandleByPciBusId("0000:1b:00.0")),
		"by UUID":  second(lib.DeviceGetHandleByUUID(uuid)),
		"PCI info": second(d0.GetPciInfo()),
	} {
		if ret != nvml.ERROR_GPU_IS_LOST {
			t.Errorf("lost GPU %s: %v", name, ret)
		}
	}
	if _, ret := recoveryField(t, d0); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("field values of a lost GPU: %v", ret)
	}
	if _, ret := lib.DeviceGetHandleByIndex(1); ret != nvml.SUCCESS {
		t.Errorf("the other GPU: %v", ret)
	}
	if err := h.XID("0000:1b:00.0", 48, nil, nil); err == nil {
		t.Error("a lost GPU reported an XID")
	}

	if err := h.Recover("0000:1b:00.0"); err != nil {
		t.Fatal(err)
	}
	if ev, ret := waitEvent(t, lib, set); ret != nvml.SUCCESS || ev.EventType != nvml.EventTypeGpuRecoveryAction {
		t.Fatalf("event after clear: %+v %v", ev, ret)
	}
	if a, ret := recoveryField(t, d0); ret != nvml.SUCCESS || a != 0 {
		t.Errorf("recovery action after clear: %d %v", a, ret)
	}
	if _, ret := lib.DeviceGetHandleByIndex(0); ret != nvml.SUCCESS {
		t.Errorf("cleared GPU: %v", ret)
	}
}

func second[A, B any](_ A, b B) B { return b }

func TestNoRecoveryActionField(t *testing.T) {
	h := build(t, `gpus: [{model: a100-40gb, count: 1, noRecoveryAction: true}]`)
	h.NVML.Init()
	d, _ := h.NVML.DeviceGetHandleByIndex(0)
	if _, ret := recoveryField(t, d); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("field on a driver without it: %v", ret)
	}
	if types, _ := d.GetSupportedEventTypes(); types&nvml.EventTypeGpuRecoveryAction != 0 {
		t.Error("recovery-action events without the field")
	}
}

// TestDriverNotLoaded: without the driver NVML's Init fails and any other
// call panics, as it kills a real process; once loaded, Init succeeds. The
// driver in use cannot be unloaded.
func TestDriverNotLoaded(t *testing.T) {
	h := build(t, `gpus: [{model: h100-80gb, count: 1}]`)
	if err := h.SetDriverLoaded(false); err != nil {
		t.Fatal(err)
	}
	if ret := h.NVML.Init(); ret != nvml.ERROR_LIBRARY_NOT_FOUND {
		t.Fatalf("Init without the driver: %v", ret)
	}
	func() {
		defer func() {
			if p := recover(); p == nil || !strings.Contains(p.(string), "DeviceGetCount called while the NVIDIA driver is not loaded") {
				t.Errorf("call after a failed Init: panic %v", p)
			}
		}()
		h.NVML.DeviceGetCount()
	}()
	if err := h.SetDriverLoaded(true); err != nil {
		t.Fatal(err)
	}
	if ret := h.NVML.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init with the driver: %v", ret)
	}
	if n, _ := h.NVML.DeviceGetCount(); n != 1 {
		t.Errorf("%d GPUs", n)
	}
	if err := h.SetDriverLoaded(false); err == nil {
		t.Error("driver unloaded under an initialised NVML")
	}
	h.NVML.Shutdown()
	if err := h.SetDriverLoaded(false); err != nil {
		t.Error(err)
	}
}

// TestGPUStall: a stalled GPU's health query blocks and its XID is held;
// the other GPU answers, and so do the stalled GPU's other queries. At
// resume the query returns and the XID arrives.
func TestGPUStall(t *testing.T) {
	h := build(t, `gpus: [{model: h100-80gb, count: 2}]`)
	lib := h.NVML
	lib.Init()
	set, _ := lib.EventSetCreate()
	defer lib.EventSetFree(set)
	d0, _ := lib.DeviceGetHandleByIndex(0)
	d1, _ := lib.DeviceGetHandleByIndex(1)
	if ret := d0.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := h.Stall("0000:1b:00.0"); err != nil {
		t.Fatal(err)
	}
	answered := make(chan nvml.Return, 1)
	go func() {
		_, ret := recoveryField(t, d0)
		answered <- ret
	}()
	if err := h.XID("0000:1b:00.0", 48, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, ret := lib.EventSetWait(set, 100); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("an event of a stalled GPU: %v", ret)
	}
	select {
	case ret := <-answered:
		t.Fatalf("a stalled GPU answered its health query: %v", ret)
	default:
	}
	if _, ret := recoveryField(t, d1); ret != nvml.SUCCESS {
		t.Errorf("the other GPU: %v", ret)
	}
	if _, ret := d0.GetUUID(); ret != nvml.SUCCESS {
		t.Errorf("the stalled GPU's UUID: %v", ret)
	}
	if err := h.Resume("0000:1b:00.0"); err != nil {
		t.Fatal(err)
	}
	if ret := <-answered; ret != nvml.SUCCESS {
		t.Errorf("the health query after resume: %v", ret)
	}
	if ev, ret := waitEvent(t, lib, set); ret != nvml.SUCCESS || ev.EventData != 48 {
		t.Errorf("the held XID after resume: %+v %v", ev, ret)
	}
}
