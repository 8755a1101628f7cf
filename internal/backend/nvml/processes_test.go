// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"errors"
	"fmt"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
)

// madeUp is a PID no process has here (above the kernel's pid_max limit):
// the mock lists it until it is replaced.
const madeUp = 1 << 23

func u64(v uint64) *uint64 { return &v }

// TestGPUProcesses: every process on the GPU once, by PID, MPS clients
// marked, memory and MIG instance as the driver tells them; a process
// that exits drops out.
func TestGPUProcesses(t *testing.T) {
	b, h := backend(t, `gpus: [{model: h100-80gb, count: 1}, {model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.40gb, start: 4}]}]`)
	const migGPU = "0000:43:00.0"
	if got, err := b.GPUProcesses(h100); err != nil || len(got) != 0 {
		t.Fatalf("idle GPU: %+v %v", got, err)
	}
	sleep := exec.Command("sleep", "600")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	server := hw.GPUProcess{PID: madeUp + 3, UsedMemory: u64(300 << 20)} // nvidia-cuda-mps-server
	client := hw.GPUProcess{PID: uint32(sleep.Process.Pid), UsedMemory: u64(20 << 30), MPS: true}
	untold := hw.GPUProcess{PID: madeUp + 1, MPS: true}
	if err := h.SetGPUProcesses(h100, []hw.GPUProcess{server, client, untold}); err != nil {
		t.Fatal(err)
	}
	got, err := b.GPUProcesses(h100)
	if want := []hw.GPUProcess{client, untold, server}; err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("GPUProcesses: %+v %v, want %+v", got, err, want)
	}
	_ = sleep.Process.Kill()
	_ = sleep.Wait()
	if got, err := b.GPUProcesses(h100); err != nil || len(got) != 2 || got[0].PID != untold.PID {
		t.Errorf("after the client exited: %+v %v", got, err)
	}

	gi := 0 // the static 3g.40gb
	inMIG := hw.GPUProcess{PID: madeUp, UsedMemory: u64(1 << 30), GPUInstance: &gi}
	if err := h.SetGPUProcesses(migGPU, []hw.GPUProcess{inMIG}); err != nil {
		t.Fatal(err)
	}
	if got, err := b.GPUProcesses(migGPU); err != nil || !reflect.DeepEqual(got, []hw.GPUProcess{inMIG}) {
		t.Errorf("in a MIG instance: %+v %v", got, err)
	}
	if _, err := b.GPUProcesses("0000:99:00.0"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown GPU: %v", err)
	}
}

// procLib answers the process lists of every GPU with its own.
type procLib struct {
	nvml.Interface
	compute, mps func() ([]nvml.ProcessInfo, nvml.Return)
}

func (l procLib) DeviceGetHandleByPciBusId(id string) (nvml.Device, nvml.Return) {
	d, ret := l.Interface.DeviceGetHandleByPciBusId(id)
	if ret != nvml.SUCCESS {
		return d, ret
	}
	return procDevice{d, l}, ret
}

type procDevice struct {
	nvml.Device
	l procLib
}

func (d procDevice) GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	if d.l.compute == nil {
		return d.Device.GetComputeRunningProcesses()
	}
	return d.l.compute()
}

func (d procDevice) GetMPSComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return) {
	if d.l.mps == nil {
		return d.Device.GetMPSComputeRunningProcesses()
	}
	return d.l.mps()
}

// TestGPUProcessesAsDriversAnswer: the union of both lists whatever list
// carries a client, a process with contexts in several MIG instances
// once, the driver's "not available" values, an old driver without the
// MPS list, and errors that name the GPU and the call.
func TestGPUProcessesAsDriversAnswer(t *testing.T) {
	h := mocktest.Open(t, `gpus: [{model: h100-80gb, count: 1}, {model: h100-80gb, count: 1, mig: true}]`)
	const migGPU = "0000:43:00.0"
	const na, noGI = ^uint64(0), uint32(invalidGIID)
	list := func(infos ...nvml.ProcessInfo) func() ([]nvml.ProcessInfo, nvml.Return) {
		return func() ([]nvml.ProcessInfo, nvml.Return) { return infos, nvml.SUCCESS }
	}
	fail := func(ret nvml.Return) func() ([]nvml.ProcessInfo, nvml.Return) {
		return func() ([]nvml.ProcessInfo, nvml.Return) { return nil, ret }
	}
	gi := func(v int) *int { return &v }
	for name, tc := range map[string]struct {
		gpu          string
		compute, mps func() ([]nvml.ProcessInfo, nvml.Return)
		want         []hw.GPUProcess
		wantErr      string
	}{
		"client in the MPS list only, memory told there": {
			compute: list(nvml.ProcessInfo{Pid: 20, UsedGpuMemory: 100, GpuInstanceId: noGI}),
			mps:     list(nvml.ProcessInfo{Pid: 10, UsedGpuMemory: 5, GpuInstanceId: noGI}),
			want:    []hw.GPUProcess{{PID: 10, UsedMemory: u64(5), MPS: true}, {PID: 20, UsedMemory: u64(100)}},
		},
		"client in both lists, memory told by one": {
			compute: list(nvml.ProcessInfo{Pid: 10, UsedGpuMemory: na, GpuInstanceId: noGI}),
			mps:     list(nvml.ProcessInfo{Pid: 10, UsedGpuMemory: 7, GpuInstanceId: noGI}),
			want:    []hw.GPUProcess{{PID: 10, UsedMemory: u64(7), MPS: true}},
		},
		"client in both lists, told by both: not added": {
			compute: list(nvml.ProcessInfo{Pid: 10, UsedGpuMemory: 7, GpuInstanceId: noGI}),
			mps:     list(nvml.ProcessInfo{Pid: 10, UsedGpuMemory: 7, GpuInstanceId: noGI}),
			want:    []hw.GPUProcess{{PID: 10, UsedMemory: u64(7), MPS: true}},
		},
		"memory not available": {
			compute: list(nvml.ProcessInfo{Pid: 10, UsedGpuMemory: na, GpuInstanceId: noGI}),
			mps:     list(),
			want:    []hw.GPUProcess{{PID: 10}},
		},
		"a GPU instance ID with MIG off is none": {
			compute: list(nvml.ProcessInfo{Pid: 10, UsedGpuMemory: 1, GpuInstanceId: 0}),
			mps:     list(),
			want:    []hw.GPUProcess{{PID: 10, UsedMemory: u64(1)}},
		},
		"contexts in two MIG instances": {
			gpu: migGPU,
			compute: list(nvml.ProcessInfo{Pid: 10, UsedGpuMemory: 2, GpuInstanceId: 5},
				nvml.ProcessInfo{Pid: 10, UsedGpuMemory: 3, GpuInstanceId: 1},
				nvml.ProcessInfo{Pid: 11, UsedGpuMemory: 3, GpuInstanceId: 1},
				nvml.ProcessInfo{Pid: 11, UsedGpuMemory: na, GpuInstanceId: 2}),
			mps:  list(),
			want: []hw.GPUProcess{{PID: 10, UsedMemory: u64(5), GPUInstance: gi(1)}, {PID: 11, GPUInstance: gi(1)}},
		},
		"old driver without the MPS list": {
			compute: list(nvml.ProcessInfo{Pid: 10, UsedGpuMemory: 1, GpuInstanceId: noGI}),
			mps:     fail(nvml.ERROR_NOT_SUPPORTED),
			want:    []hw.GPUProcess{{PID: 10, UsedMemory: u64(1)}},
		},
		"MPS list fails": {
			compute: list(), mps: fail(nvml.ERROR_UNKNOWN),
			wantErr: "GPU 0 (0000:1b:00.0): GetMPSComputeRunningProcesses: ERROR_UNKNOWN",
		},
		"compute list fails": {
			compute: fail(nvml.ERROR_NOT_SUPPORTED),
			wantErr: "GPU 0 (0000:1b:00.0): GetComputeRunningProcesses: ERROR_NOT_SUPPORTED",
		},
	} {
		t.Run(name, func(t *testing.T) {
			b := New(procLib{h.NVML, tc.compute, tc.mps}, WithSysfs(h.Sysfs))
			if err := b.Init(); err != nil {
				t.Fatal(err)
			}
			defer b.Shutdown()
			gpu := tc.gpu
			if gpu == "" {
				gpu = h100
			}
			got, err := b.GPUProcesses(gpu)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("%+v %v, want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("%s: %s, want %s", name, show(got), show(tc.want))
			}
		})
	}
}

func show(procs []hw.GPUProcess) string {
	var b strings.Builder
	for _, p := range procs {
		fmt.Fprintf(&b, "{pid %d", p.PID)
		if p.UsedMemory != nil {
			fmt.Fprintf(&b, " mem %d", *p.UsedMemory)
		}
		if p.MPS {
			b.WriteString(" mps")
		}
		if p.GPUInstance != nil {
			fmt.Fprintf(&b, " gi %d", *p.GPUInstance)
		}
		b.WriteString("}")
	}
	return "[" + b.String() + "]"
}
