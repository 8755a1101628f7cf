// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package persist keeps a mock node's state across processes, as hardware
// outlives the agent (HWDRA_MOCK_DIR), and paces its calls (timings, with
// busy markers a test can wait for): every part of the node reports its
// changes to a Dir. State is the saved state, which tests read from
// outside (ReadState).
package persist

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/hw"
)

// DirEnv makes the mock hardware outlive the process, as real hardware
// outlives the agent: HWDRA_MOCK_DIR=/path puts the mock's trees (sys,
// proc, dev) in that directory instead of a fresh temp directory, keeps
// it at Close, and saves the hardware's state there after every change.
// A process that opens the directory later (the agent restarted after a
// SIGKILL) gets the hardware as the last one left it: MIG modes, GPU and
// compute instances (same IDs, profiles, placements, MIG UUIDs and
// capability files), processes set with SetProcesses, mediated
// devices, and every VF's settings. Only one process at a time may use a
// directory; reopening it with another profile is an error (timings may
// differ). ReadState reads the state from outside.
const DirEnv = "HWDRA_MOCK_DIR"

// State is the mock hardware's state as saved in its directory (see
// DirEnv): what a test compares before and after.
type State struct {
	Version string `json:"version"`
	// Profile is the name of the profile the hardware was built from.
	Profile string `json:"profile"`
	// Spec is that profile without timings: the directory refuses others.
	Spec json.RawMessage `json:"spec"`
	// GPUs, in PCI order.
	GPUs []GPUState `json:"gpus,omitempty"`
	// Mdevs are the mediated devices (vGPUs), by UUID.
	Mdevs []MdevState `json:"mdevs,omitempty"`
	// VFVGPUs are the vGPUs of the vendor-specific VFIO framework: the
	// VFs whose current_vgpu_type is set, by VF address.
	VFVGPUs []VFVGPUState `json:"vfVGPUs,omitempty"`
	// VFs are every VF's settings, keyed "<PF netdev>/<VF index>" like
	// nicsim.VFRecorder.Snapshot.
	VFs map[string]hw.VFConfig `json:"vfs,omitempty"`
	// LinksDown are the PF netdevs whose link is down.
	LinksDown []string `json:"linksDown,omitempty"`
	// DriverUnloaded: the NVIDIA driver is not loaded.
	DriverUnloaded bool `json:"driverUnloaded,omitempty"`
	// Interrupted are calls that were in progress (see profile.GPUTimings) when
	// a process using the directory died: their change was made, their
	// caller never learnt it. The last 64, oldest first.
	Interrupted []Operation `json:"interrupted,omitempty"`
	// Busy are the calls in progress now (ReadState only, never saved).
	Busy []Operation `json:"-"`
	// Calls counts the calls that reached each device since the node was
	// first built (a Reporter's Changed after Start: what the hardware
	// was asked to do, refused calls included), by device (GPU PCI
	// address, PF netdev), then call. Comparing states cannot tell a
	// change that was undone (a mode set, then restored); counting
	// calls can.
	Calls map[string]map[string]int `json:"calls,omitempty"`
}

// GPUSettingCalls are the calls that change a GPU's settings, rather than
// make or remove something on it: its MIG mode, its compute mode and its
// time slice.
var GPUSettingCalls = []string{CallSetMigMode, CallSetComputeMode, CallSetTimeSlice}

// SettingCalls are the calls of GPUSettingCalls in calls (a State's or
// mock.Hardware's Calls), by GPU then call; empty where none reached a
// GPU.
func SettingCalls(calls map[string]map[string]int) map[string]map[string]int {
	out := map[string]map[string]int{}
	for dev, byCall := range calls {
		for _, c := range GPUSettingCalls {
			if n := byCall[c]; n > 0 {
				if out[dev] == nil {
					out[dev] = map[string]int{}
				}
				out[dev][c] = n
			}
		}
	}
	return out
}

// GPUState is one GPU.
type GPUState struct {
	BusID string   `json:"busID"`
	UUID  string   `json:"uuid"`
	MIG   MIGState `json:"mig"`
	// Processes are those set to run on the GPU that still run, by
	// PID.
	Processes    []ProcessState     `json:"processes,omitempty"`
	GPUInstances []GPUInstanceState `json:"gpuInstances,omitempty"`
	// NextSerial is the last compute instance's creation number (MIG
	// UUIDs derive from it, so a re-created instance gets a new one).
	NextSerial uint64 `json:"nextSerial,omitempty"`
	// Lost: the GPU fell off the bus (injected); RecoveryAction is the
	// driver's recovery action field (NVML's values, 0: none).
	Lost           bool   `json:"lost,omitempty"`
	RecoveryAction uint32 `json:"recoveryAction,omitempty"`
	// ComputeMode is NVML's compute mode (0: default); TimeSlice the
	// compute time slice nvidia-smi set (0: default).
	ComputeMode int `json:"computeMode,omitempty"`
	TimeSlice   int `json:"timeSlice,omitempty"`
}

// ProcessState is a process set to run on a GPU: what NVML lists of it,
// and how the mock tells that it has exited.
type ProcessState struct {
	hw.GPUProcess
	// StartTime is the PID's start time (/proc/<pid>/stat field 22, clock
	// ticks after boot) when it was set: once the PID is gone or has
	// another, the process has exited and NVML no longer lists it. 0: no
	// such PID ran then (a test's made-up one), listed until replaced.
	StartTime uint64 `json:"startTime,omitempty"`
}

// MIGState is a GPU's MIG mode: current, and pending until a reset
// (Ampere).
type MIGState struct {
	Current bool `json:"current"`
	Pending bool `json:"pending"`
}

// GPUInstanceState is one GPU instance.
type GPUInstanceState struct {
	ID int `json:"id"`
	// Profile is the profile's name ("1g.10gb"), ProfileID the driver's
	// profile ID (nvmlGpuInstanceInfo_t.profileId).
	Profile   string `json:"profile"`
	ProfileID uint32 `json:"profileID"`
	// Start and Size are the placement, in memory slices.
	Start            int                    `json:"start"`
	Size             int                    `json:"size"`
	ComputeInstances []ComputeInstanceState `json:"computeInstances,omitempty"`
}

// ComputeInstanceState is one compute instance.
type ComputeInstanceState struct {
	ID int `json:"id"`
	// ProfileID is the COMPUTE_INSTANCE_PROFILE_* index.
	ProfileID uint32 `json:"profileID"`
	Start     int    `json:"start"`
	Size      int    `json:"size"`
	// Serial is its creation number; UUID its MIG device's UUID.
	Serial uint64 `json:"serial"`
	UUID   string `json:"uuid"`
}

// MdevState is one mediated device (a vGPU).
type MdevState struct {
	UUID string `json:"uuid"`
	// GPU is the physical GPU's PCI address, Parent the function it was
	// created on (a VF of it).
	GPU    string `json:"gpu"`
	Parent string `json:"parent"`
	TypeID uint32 `json:"typeID"`
	Type   string `json:"type"`
	// GPUInstance hosts a MIG-backed vGPU; -1 for a time-sliced one.
	GPUInstance int `json:"gpuInstance"`
	IOMMUGroup  int `json:"iommuGroup"`
}

// VFVGPUState is one VF that is a vGPU (nvidia/current_vgpu_type set).
type VFVGPUState struct {
	VF     string `json:"vf"`
	GPU    string `json:"gpu"`
	TypeID uint32 `json:"typeID"`
	Type   string `json:"type"`
	// GPUInstance hosts a MIG-backed vGPU; -1 for a time-sliced one.
	GPUInstance int    `json:"gpuInstance"`
	UUID        string `json:"uuid"`
}

// Operation is a mock call in progress (or interrupted).
type Operation struct {
	// Call is one of the Call constants (a profile.GPUTimings or
	// NICTimings field's JSON name for those that take time).
	Call string `json:"call"`
	// Device is the GPU's PCI address or the PF's netdev.
	Device  string    `json:"device"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
}

// Hardware is the state without what differs between equal hardware:
// the profile spec, creation counters, and calls in progress, interrupted
// or counted. Compare these.
func (s State) Hardware() State {
	out := State{Version: s.Version, Profile: s.Profile, Mdevs: s.Mdevs, VFVGPUs: s.VFVGPUs, VFs: s.VFs,
		LinksDown: s.LinksDown, DriverUnloaded: s.DriverUnloaded}
	for _, g := range s.GPUs {
		g.NextSerial = 0
		out.GPUs = append(out.GPUs, g)
	}
	return out
}

// GPU returns the state of the GPU at a PCI address.
func (s State) GPU(busID string) (GPUState, bool) {
	for _, g := range s.GPUs {
		if g.BusID == busID {
			return g, true
		}
	}
	return GPUState{}, false
}

// GPUInstanceCount is how many GPU instances exist on all GPUs.
func (s State) GPUInstanceCount() int {
	n := 0
	for _, g := range s.GPUs {
		n += len(g.GPUInstances)
	}
	return n
}

// ReadState reads the state of the mock hardware in dir (see DirEnv),
// with the calls in progress. It may run while a process uses the
// directory: the state file is replaced atomically.
func ReadState(dir string) (State, error) {
	var s State
	data, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return s, fmt.Errorf("mock hardware state: %w", err)
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("mock hardware state in %s: %w", dir, err)
	}
	if s.Version != stateVersion {
		return s, fmt.Errorf("mock hardware state in %s: version %q, this build reads %q", dir, s.Version, stateVersion)
	}
	busy, err := readBusy(dir)
	for _, op := range busy {
		// A dead process's call is over: it shows as interrupted once
		// the next process opens the directory.
		if unix.Kill(op.PID, 0) != unix.ESRCH {
			s.Busy = append(s.Busy, op)
		}
	}
	return s, err
}

const (
	stateFile    = "state.json"
	busyDir      = "busy"
	lockFile     = "lock"
	stateVersion = "hwdra.io/mock-state/v2"
	// maxInterrupted bounds State.Interrupted.
	maxInterrupted = 64
)
