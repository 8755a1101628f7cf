// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package mock_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock"
	"github.com/hwdra/hwdra/internal/mock/fault"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/mock/profile"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// persistProfile has a MIG GPU with a static instance, a vGPU host and a
// NIC: every kind of state the mock keeps.
const persistProfile = `
gpus:
- {model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.40gb, start: 4}]}
- {model: h100-80gb, count: 1, virtualization: host-vgpu}
nics:
- {model: cx7, count: 1, vfs: 4, pciAddresses: ["0000:17:00.0"]}
`

const (
	migGPU  = "0000:1b:00.0"
	vgpuGPU = "0000:43:00.0"
	vgpuVF  = "0000:43:00.4"
	pfName  = "enp23s0f0"
)

// persistDir is a directory for a persistent mock, on tmpfs where there is
// one (like the mock's temp directories: building a vGPU host's sysfs tree
// on disk is slow).
func persistDir(t *testing.T) string {
	t.Helper()
	dir, err := persist.TempDir()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "mock")
}

// openPersistent opens the profile, named "persist", in the test's mock
// directory.
func openPersistent(t *testing.T, y string) *mock.Hardware {
	t.Helper()
	p, err := profile.Parse("persist", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	h, err := mock.New(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func readState(t *testing.T, dir string) persist.State {
	t.Helper()
	s, err := persist.ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func stateJSON(s persist.State) string {
	b, _ := json.MarshalIndent(s, "", "  ")
	return string(b)
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// typeDir finds a vGPU type's directory on an mdev parent by name.
func typeDir(t *testing.T, h *mock.Hardware, parent, name string) string {
	t.Helper()
	types := filepath.Join(h.Sysfs, "bus/pci/devices", parent, "mdev_supported_types")
	entries, _ := os.ReadDir(types)
	for _, e := range entries {
		if readTrim(t, filepath.Join(types, e.Name(), "name")) == name {
			return filepath.Join("bus/pci/devices", parent, "mdev_supported_types", e.Name())
		}
	}
	t.Fatalf("no vGPU type %q on %s", name, parent)
	return ""
}

func handle(t *testing.T, h *mock.Hardware, busID string) nvml.Device {
	t.Helper()
	d, ret := h.NVML.DeviceGetHandleByPciBusId(busID)
	if ret != nvml.SUCCESS {
		t.Fatalf("GPU %s: %v", busID, ret)
	}
	return d
}

// oneSlice is the 1g.10gb profile of an H100.
func oneSlice(t *testing.T, dev nvml.Device) nvml.GpuInstanceProfileInfo {
	t.Helper()
	info, ret := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return info
}

func at(start, size uint32) *nvml.GpuInstancePlacement {
	return &nvml.GpuInstancePlacement{Start: start, Size: size}
}

func want(t *testing.T, what string, got, want nvml.Return) {
	t.Helper()
	if got != want {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}

// TestPersistentStateSurvivesReopen: every kind of change is in the state
// file when its call returns, and a new Hardware on the directory is the
// same hardware: instances with their IDs, placements, MIG UUIDs and
// capability files, processes, the mediated device with its sysfs entries
// and NVML's view of it, VF settings.
func TestPersistentStateSurvivesReopen(t *testing.T) {
	dir := persistDir(t)
	t.Setenv(persist.DirEnv, dir)
	h := openPersistent(t, persistProfile)
	if !h.Persistent() || h.Dir() != dir {
		t.Fatalf("Persistent %v, Dir %s", h.Persistent(), h.Dir())
	}
	s0 := readState(t, dir)
	if g, _ := s0.GPU(migGPU); !g.MIG.Current || len(g.GPUInstances) != 1 || g.GPUInstances[0].Profile != "3g.40gb" ||
		len(g.GPUInstances[0].ComputeInstances) != 1 {
		t.Fatalf("state at start lacks the profile's static instance:\n%s", stateJSON(s0))
	}
	if len(s0.VFs) != 4 {
		t.Fatalf("state at start has %d VFs, want 4", len(s0.VFs))
	}

	// A GPU instance and its compute instance: each on disk when created.
	dev := handle(t, h, migGPU)
	p1 := oneSlice(t, dev)
	gi, ret := dev.CreateGpuInstanceWithPlacement(&p1, at(2, 1))
	want(t, "create GI", ret, nvml.SUCCESS)
	g, _ := readState(t, dir).GPU(migGPU)
	if len(g.GPUInstances) != 2 || g.GPUInstances[1].Start != 2 || g.GPUInstances[1].Profile != "1g.10gb" {
		t.Fatalf("GI not on disk when the call returned:\n%+v", g)
	}
	ciInfo, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	_, ret = gi.CreateComputeInstance(&ciInfo)
	want(t, "create CI", ret, nvml.SUCCESS)
	g, _ = readState(t, dir).GPU(migGPU)
	if cis := g.GPUInstances[1].ComputeInstances; len(cis) != 1 || !strings.HasPrefix(cis[0].UUID, "MIG-") {
		t.Fatalf("CI not on disk when the call returned:\n%+v", g)
	}
	var migUUIDs []string
	for i := range 2 {
		m, ret := dev.GetMigDeviceHandleByIndex(i)
		want(t, "MIG handle", ret, nvml.SUCCESS)
		u, _ := m.GetUUID()
		migUUIDs = append(migUUIDs, u)
	}
	// An MPS client in the static instance (a made-up PID: listed until
	// replaced) and one that the driver does not tell the memory of.
	mem, staticGI := uint64(4<<30), 0
	procs := []hw.GPUProcess{{PID: 42, UsedMemory: &mem, MPS: true, GPUInstance: &staticGI}, {PID: 43}}
	if err := h.SetGPUProcesses(migGPU, procs); err != nil {
		t.Fatal(err)
	}
	if g, _ := readState(t, dir).GPU(migGPU); len(g.Processes) != 2 || !reflect.DeepEqual(g.Processes[0].GPUProcess, procs[0]) ||
		!reflect.DeepEqual(g.Processes[1].GPUProcess, procs[1]) {
		t.Fatalf("processes not on disk: %+v", g.Processes)
	}

	// A vGPU.
	ts := typeDir(t, h, vgpuVF, "NVIDIA H100-10C")
	const mdev = "0b8f1a52-7b7e-4bc2-a0b5-cc1f8b3a0001"
	if err := h.SysfsWriter().WriteFile(filepath.Join(ts, "create"), []byte(mdev)); err != nil {
		t.Fatal(err)
	}
	if m := readState(t, dir).Mdevs; len(m) != 1 || m[0].UUID != mdev || m[0].Parent != vgpuVF || m[0].GPU != vgpuGPU || m[0].Type != "NVIDIA H100-10C" {
		t.Fatalf("mdev not on disk when the write returned: %+v", m)
	}

	// VF settings, also those a refused call leaves applied.
	vfs := h.NICs().VFConfigurator()
	ref := hw.VFRef{PF: pfName, Index: 1, Netdev: pfName + "v1"}
	cfg := hw.VFConfig{MAC: "02:00:00:00:00:11", VLAN: 7, MaxTxRateMbps: 10000, Trust: true}
	if err := vfs.SetVF(ref, cfg); err != nil {
		t.Fatal(err)
	}
	if got := readState(t, dir).VFs[pfName+"/1"]; got.MAC != cfg.MAC || got.MaxTxRateMbps != 10000 || !got.Trust {
		t.Fatalf("VF settings not on disk: %+v", got)
	}
	if err := vfs.SetVF(hw.VFRef{PF: pfName, Index: 2}, hw.VFConfig{MAC: "02:00:00:00:00:22", VLAN: 5000}); err == nil {
		t.Fatal("VLAN 5000 accepted")
	}
	if got := readState(t, dir).VFs[pfName+"/2"]; got.MAC != "02:00:00:00:00:22" {
		t.Fatalf("the MAC a refused call applied is not on disk: %+v", got)
	}

	before := readState(t, dir)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sys")); err != nil {
		t.Fatalf("Close removed the persistent trees: %v", err)
	}

	h = openPersistent(t, persistProfile)
	after := readState(t, dir)
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("state changed across Close/New:\nbefore %s\nafter %s", stateJSON(before), stateJSON(after))
	}
	// The hardware itself, as NVML, sysfs and procfs show it.
	dev = handle(t, h, migGPU)
	for i, u := range migUUIDs {
		m, ret := dev.GetMigDeviceHandleByIndex(i)
		want(t, "MIG handle after reopen", ret, nvml.SUCCESS)
		if got, _ := m.GetUUID(); got != u {
			t.Errorf("MIG device %d: UUID %s after reopen, was %s", i, got, u)
		}
	}
	gi, ret = dev.GetGpuInstanceById(1)
	want(t, "GI 1 after reopen", ret, nvml.SUCCESS)
	if info, _ := gi.GetInfo(); info.Placement.Start != 2 || info.ProfileId != p1.Id {
		t.Errorf("GI 1 after reopen: %+v", info)
	}
	minor, _ := dev.GetMinorNumber()
	for _, f := range []string{"gi1/access", "gi1/ci0/access", "gi0/ci0/access"} {
		if _, err := os.Stat(filepath.Join(h.ProcRoot(), "driver/nvidia/capabilities", "gpu"+strconv.Itoa(minor), "mig", f)); err != nil {
			t.Errorf("capability file after reopen: %v", err)
		}
	}
	if list, _ := dev.GetComputeRunningProcesses(); len(list) != 2 || list[0] != (nvml.ProcessInfo{Pid: 42, UsedGpuMemory: mem}) ||
		list[1].Pid != 43 || list[1].UsedGpuMemory != ^uint64(0) {
		t.Errorf("compute processes after reopen: %+v", list)
	}
	if list, _ := dev.GetMPSComputeRunningProcesses(); len(list) != 1 || list[0].Pid != 42 {
		t.Errorf("MPS processes after reopen: %+v", list)
	}
	if got := h.MdevUUIDs(); !slices.Equal(got, []string{mdev}) {
		t.Errorf("mdevs after reopen: %v", got)
	}
	if got := readTrim(t, filepath.Join(h.Sysfs, ts, "available_instances")); got != "0" {
		t.Errorf("a VF hosting a restored vGPU offers %s more", got)
	}
	if vg, _ := handle(t, h, vgpuGPU).GetActiveVgpus(); len(vg) != 1 {
		t.Errorf("active vGPUs after reopen: %d", len(vg))
	}
	if got, err := h.NICs().VFConfigurator().GetVF(ref); err != nil || got.MAC != cfg.MAC || got.VLAN != 7 || got.MaxTxRateMbps != 10000 {
		t.Errorf("VF after reopen: %+v %v", got, err)
	}

	// The restored hardware works on: undo everything, reopen, all gone.
	ci, ret := gi.GetComputeInstanceById(0)
	want(t, "CI after reopen", ret, nvml.SUCCESS)
	want(t, "destroy restored CI", ci.Destroy(), nvml.SUCCESS)
	want(t, "destroy restored GI", gi.Destroy(), nvml.SUCCESS)
	if err := h.SysfsWriter().WriteFile("bus/mdev/devices/"+mdev+"/remove", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := h.SetRunningProcesses(migGPU); err != nil {
		t.Fatal(err)
	}
	for _, vf := range []int{1, 2} {
		if err := h.NICs().VFConfigurator().SetVF(hw.VFRef{PF: pfName, Index: vf}, s0.VFs[pfName+"/"+strconv.Itoa(vf)]); err != nil {
			t.Fatal(err)
		}
	}
	h.Close()
	h = openPersistent(t, persistProfile)
	if got := readState(t, dir).Hardware(); !reflect.DeepEqual(got, s0.Hardware()) {
		t.Errorf("after undoing everything the hardware is not as it started:\nstart %s\nnow %s", stateJSON(s0.Hardware()), stateJSON(got))
	}
	if _, err := os.Stat(filepath.Join(h.ProcRoot(), "driver/nvidia/capabilities/gpu"+strconv.Itoa(minor)+"/mig/gi1")); !os.IsNotExist(err) {
		t.Errorf("capabilities of the destroyed GI after reopen: %v", err)
	}
}

// TestCallsCounted: every call that reaches a device after the node is
// built is counted, refused ones too, and a change undone (a compute mode
// set, then set back) shows in the counts though not in the state; the
// node's own setup (its static MIG instance) is not counted; the counts
// are saved and go on across processes, and State.Hardware leaves them
// out.
func TestCallsCounted(t *testing.T) {
	dir := persistDir(t)
	t.Setenv(persist.DirEnv, dir)
	h := openPersistent(t, persistProfile)
	s0 := readState(t, dir)
	if len(h.Calls()) != 0 || len(s0.Calls) != 0 {
		t.Fatalf("calls counted while the node was built: %v, saved %v", h.Calls(), s0.Calls)
	}
	dev := handle(t, h, vgpuGPU)
	want(t, "set ExclusiveProcess", dev.SetComputeMode(nvml.COMPUTEMODE_EXCLUSIVE_PROCESS), nvml.SUCCESS)
	want(t, "set Default", dev.SetComputeMode(nvml.COMPUTEMODE_DEFAULT), nvml.SUCCESS)
	want(t, "set ExclusiveThread", dev.SetComputeMode(nvml.COMPUTEMODE_EXCLUSIVE_THREAD), nvml.ERROR_NOT_SUPPORTED)
	_, ret := handle(t, h, migGPU).SetMigMode(nvml.DEVICE_MIG_DISABLE) // its instance is in the way
	want(t, "MIG off with an instance", ret, nvml.ERROR_IN_USE)
	if err := h.Inject(fault.Fault{Kind: fault.TimeSlice, GPU: vgpuGPU, TimeSlice: 9}); err == nil {
		t.Error("time slice 9 accepted")
	}
	wantCalls := map[string]map[string]int{
		vgpuGPU: {persist.CallSetComputeMode: 3, persist.CallSetTimeSlice: 1},
		migGPU:  {persist.CallSetMigMode: 1},
	}
	if got := persist.SettingCalls(h.Calls()); !reflect.DeepEqual(got, wantCalls) {
		t.Errorf("setting calls %v, want %v", got, wantCalls)
	}
	s1 := readState(t, dir)
	if !reflect.DeepEqual(persist.SettingCalls(s1.Calls), wantCalls) {
		t.Errorf("saved setting calls %v, want %v", s1.Calls, wantCalls)
	}
	if !reflect.DeepEqual(s1.Hardware(), s0.Hardware()) {
		t.Errorf("the state differs though every change was undone or refused:\nbefore %s\nafter %s", stateJSON(s0.Hardware()), stateJSON(s1.Hardware()))
	}
	h.Close()
	h = openPersistent(t, persistProfile)
	want(t, "set Default again", handle(t, h, vgpuGPU).SetComputeMode(nvml.COMPUTEMODE_DEFAULT), nvml.SUCCESS)
	if got := h.Calls()[vgpuGPU][persist.CallSetComputeMode]; got != 4 {
		t.Errorf("compute mode calls %d after the reopen, want the 3 before and 1 since", got)
	}
}

// TestPersistentDirRefusals: another profile on the directory is refused
// naming it (other timings are fine); a second user while one has it open
// is refused.
func TestPersistentDirRefusals(t *testing.T) {
	dir := persistDir(t)
	t.Setenv(persist.DirEnv, dir)
	const one = "gpus: [{model: h100-80gb, count: 1}]"
	h := openPersistent(t, one)
	p, _ := profile.Parse("persist", []byte(one))
	if _, err := mock.New(p); err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second open while in use: %v", err)
	}
	h.Close()
	p, _ = profile.Parse("persist", []byte("gpus: [{model: h100-80gb, count: 2}]"))
	if _, err := mock.New(p); err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "profile") {
		t.Errorf("other profile on the directory: %v", err)
	}
	p, _ = profile.Parse("other", []byte(one))
	if _, err := mock.New(p); err == nil || !strings.Contains(err.Error(), `profile "persist"`) {
		t.Errorf("other profile name on the directory: %v", err)
	}
	openPersistent(t, "gpus: [{model: h100-80gb, count: 1, timings: {createGpuInstance: 1s}}]")
}

// TestTimingsEnvValidation: a bad HWDRA_MOCK_TIMINGS is an error naming
// it and the call it does not know (the profile's timings are
// profile.Parse's).
func TestTimingsEnvValidation(t *testing.T) {
	t.Setenv(persist.TimingsEnv, "createGpuInstance=1s,frobnicate=2s")
	p, _ := profile.Parse("t", []byte("gpus: [{model: h100-80gb, count: 1}]"))
	if _, err := mock.New(p); err == nil || !strings.Contains(err.Error(), persist.TimingsEnv) || !strings.Contains(err.Error(), "frobnicate") {
		t.Errorf("bad %s: %v", persist.TimingsEnv, err)
	}
}

// TestTimings: a slowed call makes its change at once and returns after
// its time, showing as busy meanwhile; other calls and devices are not
// slowed.
func TestTimings(t *testing.T) {
	dir := persistDir(t)
	t.Setenv(persist.DirEnv, dir)
	h := openPersistent(t, `
gpus:
- {model: h100-80gb, count: 1, mig: true, timings: {createGpuInstance: 300ms}}
- {model: h100-80gb, count: 1, mig: true}
nics:
- {model: cx7, count: 1, vfs: 2, timings: {setVF: 300ms}}
`)
	dev := handle(t, h, migGPU)
	p1 := oneSlice(t, dev)
	done := make(chan time.Duration)
	began := time.Now()
	go func() {
		_, ret := dev.CreateGpuInstanceWithPlacement(&p1, at(0, 1))
		want(t, "slow create", ret, nvml.SUCCESS)
		done <- time.Since(began)
	}()
	var busy []persist.Operation
	waitfor.True(t, "the slow create listed as busy", 5*time.Second, func() bool {
		busy = readState(t, dir).Busy
		return len(busy) > 0
	})
	if len(busy) != 1 || busy[0].Call != "createGpuInstance" || busy[0].Device != migGPU || busy[0].PID != os.Getpid() {
		t.Fatalf("busy while creating: %+v", busy)
	}
	if n, _ := dev.GetGpuInstanceRemainingCapacity(&p1); n != 6 {
		t.Errorf("the GI does not exist while its call blocks: %d 1g.10gb left", n)
	}
	if took := <-done; took < 300*time.Millisecond {
		t.Errorf("slowed create took %v", took)
	}
	if busy := readState(t, dir).Busy; len(busy) != 0 {
		t.Errorf("busy after the call returned: %+v", busy)
	}
	fast := time.Now()
	other := handle(t, h, "0000:43:00.0")
	if _, ret := other.CreateGpuInstanceWithPlacement(&p1, at(0, 1)); ret != nvml.SUCCESS || time.Since(fast) > 100*time.Millisecond {
		t.Errorf("the other group's GPU: %v in %v", ret, time.Since(fast))
	}
	slow := time.Now()
	if err := h.NICs().VFConfigurator().SetVF(hw.VFRef{PF: h.NICs().Netdevs()[0], Index: 0}, hw.VFConfig{MaxTxRateMbps: 1000}); err != nil || time.Since(slow) < 300*time.Millisecond {
		t.Errorf("slowed SetVF: %v in %v", err, time.Since(slow))
	}
	t.Setenv(persist.TimingsEnv, "createGpuInstance=0s")
	t.Setenv(persist.DirEnv, "")
	h2 := mocktest.Open(t, "gpus: [{model: h100-80gb, count: 1, mig: true, timings: {createGpuInstance: 10s}}]")
	fast = time.Now()
	if _, ret := handle(t, h2, migGPU).CreateGpuInstanceWithPlacement(&p1, at(0, 1)); ret != nvml.SUCCESS || time.Since(fast) > time.Second {
		t.Errorf("%s=createGpuInstance=0s does not override the profile: %v in %v", persist.TimingsEnv, ret, time.Since(fast))
	}
}

const helperEnv = "HWDRA_MOCK_TEST_HELPER"

// TestPersistentCrashMidOperation: a process killed (SIGKILL) while its
// GPU instance creation blocks leaves the instance made, as hardware
// would; the next process finds it, with the call listed as interrupted,
// and can destroy it.
func TestPersistentCrashMidOperation(t *testing.T) {
	if os.Getenv(helperEnv) == "create-gi" {
		crashHelper()
		return
	}
	dir := persistDir(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestPersistentCrashMidOperation$")
	cmd.Env = append(os.Environ(), helperEnv+"=create-gi", persist.DirEnv+"="+dir, persist.TimingsEnv+"=createGpuInstance=60s")
	out, err := os.Create(filepath.Join(t.TempDir(), "helper.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	var s persist.State
	waitfor.True(t, "the helper busy", 30*time.Second, func() bool {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(out.Name())
			t.Fatalf("helper exited before it was busy: %v\n%s", err, log)
		default:
		}
		s, _ = persist.ReadState(dir)
		return len(s.Busy) > 0
	})
	if s.Busy[0].Call != "createGpuInstance" || s.Busy[0].PID != cmd.Process.Pid {
		t.Fatalf("busy: %+v", s.Busy)
	}
	t.Setenv(persist.DirEnv, dir)
	p, _ := profile.Parse("persist", []byte(persistProfile))
	if _, err := mock.New(p); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("open while the helper has it: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	s = readState(t, dir)
	if len(s.Busy) != 0 {
		t.Errorf("a dead process's call reported busy: %+v", s.Busy)
	}
	if g, _ := s.GPU(migGPU); len(g.GPUInstances) != 2 || g.GPUInstances[1].Profile != "1g.10gb" || len(g.GPUInstances[1].ComputeInstances) != 0 {
		t.Fatalf("after the crash the state file lacks the GPU instance whose call was interrupted:\n%s", stateJSON(s))
	}

	h := openPersistent(t, persistProfile)
	s = readState(t, dir)
	if len(s.Interrupted) != 1 || s.Interrupted[0].Call != "createGpuInstance" || s.Interrupted[0].Device != migGPU {
		t.Errorf("interrupted calls: %+v", s.Interrupted)
	}
	if busy, _ := os.ReadDir(filepath.Join(dir, "busy")); len(busy) != 0 {
		t.Errorf("stale busy markers: %d", len(busy))
	}
	dev := handle(t, h, migGPU)
	gi, ret := dev.GetGpuInstanceById(1)
	want(t, "the interrupted call's GI", ret, nvml.SUCCESS)
	want(t, "destroy it", gi.Destroy(), nvml.SUCCESS)
	if g, _ := readState(t, dir).GPU(migGPU); len(g.GPUInstances) != 1 {
		t.Errorf("after destroying it: %+v", g.GPUInstances)
	}
}

// crashHelper runs in the helper process: it creates a GPU instance, whose
// call blocks until the test kills it.
func crashHelper() {
	p, err := profile.Parse("persist", []byte(persistProfile))
	if err != nil {
		panic(err)
	}
	h, err := mock.New(p)
	if err != nil {
		panic(err)
	}
	d, _ := h.NVML.DeviceGetHandleByPciBusId(migGPU)
	info, _ := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	d.CreateGpuInstanceWithPlacement(&info, at(2, 1))
	os.Exit(3) // not reached: killed while the call blocks
}

// TestFaultsPersist: a lost GPU, a recovery action asked for, a link down
// and an unloaded driver outlive the process, as on hardware.
func TestFaultsPersist(t *testing.T) {
	dir := persistDir(t)
	t.Setenv(persist.DirEnv, dir)
	const y = `
gpus: [{model: h100-80gb, count: 2}]
nics: [{model: cx7, count: 1, vfs: 2, netdevs: [pfa]}]
`
	h := openPersistent(t, y)
	for _, f := range []fault.Fault{
		{Kind: fault.GPULost, GPU: "0000:1b:00.0"},
		{Kind: fault.XID, GPU: "0000:43:00.0", XID: 48},
		{Kind: fault.Link, PF: "pfa"},
	} {
		if err := h.Inject(f); err != nil {
			t.Fatal(err)
		}
	}
	s := readState(t, dir)
	if g, _ := s.GPU("0000:1b:00.0"); !g.Lost {
		t.Errorf("saved state: GPU not lost: %+v", g)
	}
	if g, _ := s.GPU("0000:43:00.0"); g.RecoveryAction != uint32(nvml.GPU_RECOVERY_ACTION_GPU_RESET) {
		t.Errorf("saved state: recovery action %+v", g)
	}
	if len(s.LinksDown) != 1 || s.LinksDown[0] != "pfa" {
		t.Errorf("saved links down %v", s.LinksDown)
	}
	h.Close()

	h = openPersistent(t, y)
	h.NVML.Init()
	if _, ret := h.NVML.DeviceGetHandleByPciBusId("0000:1b:00.0"); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("reopened: lost GPU answers %v", ret)
	}
	// The device's fault state, as the state saved after reopening reads it.
	if g, _ := readState(t, dir).GPU("0000:43:00.0"); g.RecoveryAction != uint32(nvml.GPU_RECOVERY_ACTION_GPU_RESET) {
		t.Errorf("reopened: recovery action %d", g.RecoveryAction)
	}
	if op := readTrim(t, filepath.Join(h.Sysfs, "class", "net", "pfa", "operstate")); op != "down" {
		t.Errorf("reopened: pfa operstate %q", op)
	}
	h.NVML.Shutdown()
	if err := h.SetDriverLoaded(false); err != nil {
		t.Fatal(err)
	}
	h.Close()
	h = openPersistent(t, y)
	if h.DriverLoaded() || h.NVML.Init() != nvml.ERROR_LIBRARY_NOT_FOUND {
		t.Error("reopened: the driver is loaded again")
	}
	if _, err := os.Stat(filepath.Join(h.ProcRoot(), "driver/nvidia/version")); !os.IsNotExist(err) {
		t.Errorf("reopened with the driver unloaded: the kernel module's version file is there (%v)", err)
	}
}

// TestKernelModuleVersion: the loaded kernel module says its version in
// the node's proc, the one NVML reports, and the file goes with the
// module.
func TestKernelModuleVersion(t *testing.T) {
	h := mocktest.Open(t, "gpus: [{model: h100-80gb, count: 1}]")
	file := filepath.Join(h.ProcRoot(), "driver/nvidia/version")
	if v := readTrim(t, file); !strings.HasPrefix(v, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "+h.DriverVersion()+"  ") {
		t.Errorf("%s: %q", file, v)
	}
	if err := h.SetDriverLoaded(false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("driver unloaded: %s is there (%v)", file, err)
	}
	if err := h.SetDriverLoaded(true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Errorf("driver loaded again: %v", err)
	}
}

// TestInjectDir: faults reach the hardware through its directory, from
// another process as from this one; the answer carries the error; a
// persistent directory that no process holds refuses.
func TestInjectDir(t *testing.T) {
	dir := persistDir(t)
	t.Setenv(persist.DirEnv, dir)
	h := openPersistent(t, `
gpus: [{model: h100-80gb, count: 1}]
nics: [{model: cx7, count: 1, vfs: 2, netdevs: [pfa], pciAddresses: ["0000:17:00.0"]}]
`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := fault.InjectDir(ctx, dir, fault.Fault{Kind: fault.Link, PF: "0000:17:00.0"}); err != nil {
		t.Fatal(err)
	}
	if op := readTrim(t, filepath.Join(h.Sysfs, "class", "net", "pfa", "operstate")); op != "down" {
		t.Errorf("pfa operstate %q after link down", op)
	}
	if err := fault.InjectDir(ctx, dir, fault.Fault{Kind: fault.Link, PF: "nope"}); err == nil || !strings.Contains(err.Error(), `no PF "nope"`) {
		t.Errorf("unknown PF: %v", err)
	}
	if err := fault.InjectDir(ctx, dir, fault.Fault{Kind: "melt", GPU: "0000:1b:00.0"}); err == nil || !strings.Contains(err.Error(), `unknown fault "melt"`) {
		t.Errorf("unknown fault: %v", err)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, fault.InboxDir)); len(left) != 0 {
		t.Errorf("left in the inbox: %v", left)
	}
	h.Close()
	if err := fault.InjectDir(ctx, dir, fault.Fault{Kind: fault.Clear, GPU: "0000:1b:00.0"}); err == nil || !strings.Contains(err.Error(), "no process runs the mock hardware") {
		t.Errorf("nobody running it: %v", err)
	}
}
