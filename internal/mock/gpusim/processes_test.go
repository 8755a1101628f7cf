// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/procstat"
)

// madeUp is a PID no process has here (above the kernel's pid_max limit).
const madeUp = 1 << 23

// TestProcessLists: the compute list holds every process set, MPS clients
// too, with their memory (all ones where not told) and GPU instance; the
// MPS list the MPS clients alone.
func TestProcessLists(t *testing.T) {
	h := build(t, `gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.40gb, start: 4}]}]`)
	const bus = "0000:1b:00.0"
	d := device(t, h, 0)
	mem := uint64(24 << 30)
	d.RLock()
	gi := int(d.instancesLocked()[0].Info.Id) // the static 3g.40gb
	d.RUnlock()
	if err := h.SetProcesses(bus, []hw.GPUProcess{
		{PID: madeUp + 2, UsedMemory: &mem, MPS: true, GPUInstance: &gi},
		{PID: madeUp + 1},
	}); err != nil {
		t.Fatal(err)
	}
	compute, ret := d.GetComputeRunningProcesses()
	want := []nvml.ProcessInfo{
		{Pid: madeUp + 1, UsedGpuMemory: ^uint64(0), GpuInstanceId: noInstance, ComputeInstanceId: noInstance},
		{Pid: madeUp + 2, UsedGpuMemory: mem, GpuInstanceId: uint32(gi), ComputeInstanceId: 0},
	}
	if ret != nvml.SUCCESS || !reflect.DeepEqual(compute, want) {
		t.Errorf("compute list %+v %v, want %+v", compute, ret, want)
	}
	if mps, ret := d.GetMPSComputeRunningProcesses(); ret != nvml.SUCCESS || !reflect.DeepEqual(mps, want[1:]) {
		t.Errorf("MPS list %+v %v, want %+v", mps, ret, want[1:])
	}
	// The caller's values are copied.
	mem, gi = 1, gi+1
	if compute, _ := d.GetComputeRunningProcesses(); !reflect.DeepEqual(compute, want) {
		t.Errorf("the mock holds the caller's pointers: %+v", compute[1])
	}
	if err := h.SetProcesses(bus, nil); err != nil {
		t.Fatal(err)
	}
	if compute, _ := d.GetComputeRunningProcesses(); len(compute) != 0 {
		t.Errorf("compute list after clearing: %+v", compute)
	}
}

// TestProcessExits: a process that ran here when set drops out of both
// lists once it exits, and no longer keeps MIG mode from switching; a
// made-up PID stays; a PID whose start time differs (reused) is another
// process.
func TestProcessExits(t *testing.T) {
	h := build(t, `gpus: [{model: h100-80gb, count: 1}]`)
	const bus = "0000:1b:00.0"
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := uint32(cmd.Process.Pid)
	if err := h.SetProcesses(bus, []hw.GPUProcess{{PID: pid, MPS: true}, {PID: madeUp, MPS: true}}); err != nil {
		t.Fatal(err)
	}
	d := device(t, h, 0)
	pids := func(list func() ([]nvml.ProcessInfo, nvml.Return)) []uint32 {
		infos, ret := list()
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		var out []uint32
		for _, i := range infos {
			out = append(out, i.Pid)
		}
		return out
	}
	if got := pids(d.GetMPSComputeRunningProcesses); !reflect.DeepEqual(got, []uint32{pid, madeUp}) {
		t.Fatalf("running: %v, want [%d %d]", got, pid, madeUp)
	}
	if act, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.ERROR_IN_USE || act != nvml.ERROR_IN_USE {
		t.Errorf("MIG switch with processes running: %v %v", act, ret)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	for name, list := range map[string]func() ([]nvml.ProcessInfo, nvml.Return){
		"compute": d.GetComputeRunningProcesses, "MPS": d.GetMPSComputeRunningProcesses,
	} {
		if got := pids(list); !reflect.DeepEqual(got, []uint32{madeUp}) {
			t.Errorf("%s list after the process exited: %v, want [%d]", name, got, madeUp)
		}
	}
	// Its saved state leaves it out too.
	var s persist.State
	h.Snapshot(&s)
	if g := s.GPUs[0]; len(g.Processes) != 1 || g.Processes[0].PID != madeUp || g.Processes[0].StartTime != 0 {
		t.Errorf("saved processes %+v", g.Processes)
	}

	// This test's own PID, recorded with another start time: a later
	// process under a reused PID.
	self := uint32(os.Getpid())
	st, err := procstat.StartTime(int(self))
	if err != nil || st == 0 {
		t.Fatalf("own start time: %d %v", st, err)
	}
	d.Lock()
	d.processes = []persist.ProcessState{{GPUProcess: hw.GPUProcess{PID: self}, StartTime: st + 1}}
	d.Unlock()
	if got := pids(d.GetComputeRunningProcesses); len(got) != 0 {
		t.Errorf("a reused PID is listed: %v", got)
	}
	if act, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS || act != nvml.SUCCESS {
		t.Errorf("MIG switch once the processes exited: %v %v", act, ret)
	}
}

// TestSetProcessesRefusals: what no driver would list is refused, naming
// the GPU and the process, and leaves the list as it was.
func TestSetProcessesRefusals(t *testing.T) {
	h := build(t, `gpus: [{model: h100-80gb, count: 1}]`)
	const bus = "0000:1b:00.0"
	if err := h.SetRunningProcesses(bus, madeUp); err != nil {
		t.Fatal(err)
	}
	huge := uint64(1 << 40)
	gi := 0
	for want, procs := range map[string][]hw.GPUProcess{
		"process ID 0":                           {{PID: 0}},
		"process 8388608 listed twice":           {{PID: madeUp}, {PID: madeUp}},
		"process 8388608: 1099511627776 bytes":   {{PID: madeUp, UsedMemory: &huge}},
		"process 8388608: no GPU instance 0":     {{PID: madeUp, GPUInstance: &gi}},
		"no GPU 0000:99:00.0 (the GPUs: 0000:1b": nil,
	} {
		at := bus
		if procs == nil {
			at = "0000:99:00.0"
		}
		if err := h.SetProcesses(at, procs); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: %v, want an error with %q", procs, err, want)
		}
	}
	if infos, _ := device(t, h, 0).GetComputeRunningProcesses(); len(infos) != 1 || infos[0].Pid != madeUp {
		t.Errorf("a refused set changed the list: %+v", infos)
	}
}
