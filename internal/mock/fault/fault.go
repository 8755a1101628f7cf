// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package fault injects faults into mock hardware that a running process
// (the agent) uses, as `hwdra mock inject` does: the injector drops the
// fault in the hardware's directory and waits; the process's Inbox applies
// it and answers.
package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

// Kind names an injected fault.
type Kind string

const (
	// XID raises an XID on a GPU (optionally confined to a MIG GPU
	// instance): the driver delivers it to NVML event sets and, unless it
	// is an application XID, asks for a GPU reset.
	XID Kind = "xid"
	// Clear makes a GPU recover as a reset would: back on the bus,
	// no recovery action asked for.
	Clear Kind = "clear"
	// GPULost makes a GPU fall off the bus (XID 79, then every NVML
	// lookup of it answers ERROR_GPU_IS_LOST).
	GPULost Kind = "gpu-lost"
	// Link takes a PF's link down or up.
	Link Kind = "link"
	// Driver loads (or unloads) the NVIDIA driver.
	Driver Kind = "driver"
	// TimeSlice is no fault: the mock's nvidia-smi sets a GPU's compute
	// time slice (`compute-policy --set-timeslice`) through the inbox, as
	// the real tool changes the driver's state from outside the agent.
	TimeSlice Kind = "timeslice"
	// Stall makes a GPU stop answering, as a GPU hung in the driver
	// does: its health queries block and its events are held, until
	// Resume. The agent's GPU health monitor stalls on it.
	Stall Kind = "stall"
	// Resume makes a stalled GPU answer again (the held events arrive).
	Resume Kind = "resume"
	// VFRefuse makes a PF's driver refuse one VF setting (Setting:
	// nicsim.VFSettings) of each of its VFs with EPERM, as a driver or
	// firmware in a state that takes no VF changes does, until a VFRefuse
	// with no Setting.
	VFRefuse Kind = "vf-refuse"
	// Processes is no fault either: it sets the processes a GPU lists as
	// running on it (none: idle), as workloads starting and stopping
	// would.
	Processes Kind = "processes"
)

// Fault is one fault to inject into mock hardware.
type Fault struct {
	Kind Kind `json:"kind"`
	// GPU is a GPU's PCI address (xid, clear, gpu-lost).
	GPU string `json:"gpu,omitempty"`
	// XID is the XID's number (xid).
	XID uint64 `json:"xid,omitempty"`
	// GPUInstance and ComputeInstance confine an XID to one MIG instance.
	GPUInstance     *int `json:"gpuInstance,omitempty"`
	ComputeInstance *int `json:"computeInstance,omitempty"`
	// PF is a PF's netdev name or PCI address (link, vf-refuse).
	PF string `json:"pf,omitempty"`
	// Setting is the VF setting the PF refuses (vf-refuse; "": none).
	Setting string `json:"setting,omitempty"`
	// Up is the link's (link) or the driver's (driver) new state.
	Up bool `json:"up,omitempty"`
	// TimeSlice is the time slice to set (timeslice; GPU may be a UUID).
	TimeSlice int `json:"timeSlice,omitempty"`
	// Processes are the GPU's processes (processes).
	Processes []hw.GPUProcess `json:"processes,omitempty"`
}

func (f Fault) String() string {
	switch f.Kind {
	case XID:
		return fmt.Sprintf("XID %d on GPU %s", f.XID, f.GPU)
	case Link:
		return fmt.Sprintf("link %s %s", f.PF, map[bool]string{true: "up", false: "down"}[f.Up])
	case Driver:
		return fmt.Sprintf("driver %s", map[bool]string{true: "loaded", false: "unloaded"}[f.Up])
	case TimeSlice:
		return fmt.Sprintf("time slice %d on GPU %s", f.TimeSlice, f.GPU)
	case VFRefuse:
		if f.Setting == "" {
			return fmt.Sprintf("PF %s takes every VF setting", f.PF)
		}
		return fmt.Sprintf("PF %s refuses VF setting %s", f.PF, f.Setting)
	case Processes:
		if len(f.Processes) == 0 {
			return "no processes on GPU " + f.GPU
		}
		pids := make([]string, len(f.Processes))
		for i, p := range f.Processes {
			pids[i] = strconv.FormatUint(uint64(p.PID), 10)
		}
		return fmt.Sprintf("processes %s on GPU %s", strings.Join(pids, ", "), f.GPU)
	}
	return fmt.Sprintf("%s on GPU %s", f.Kind, f.GPU)
}

// InboxDir is the folder of the hardware's directory that faults reach
// the process running it through: the injector writes <InboxDir>/<id>.json,
// the owner's Inbox (watching the folder) applies it and answers
// <InboxDir>/<id>.result.
const InboxDir = "faults"

// faultResult is the owner's answer.
type faultResult struct {
	Error string `json:"error,omitempty"`
}

// InjectDir injects a fault into the mock hardware in dir (a process's
// HWDRA_MOCK_DIR, or mock.Hardware.Dir) while a process runs it, and waits
// for that process to apply it. It fails when no process runs it.
func InjectDir(ctx context.Context, dir string, f Fault) error {
	if err := inUse(dir); err != nil {
		return err
	}
	inbox := filepath.Join(dir, InboxDir)
	if _, err := os.Stat(inbox); err != nil {
		return fmt.Errorf("mock hardware in %s takes no faults (is it a mock directory of a running process?): %w", dir, err)
	}
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	id := fmt.Sprintf("%d-%d", time.Now().UnixNano(), os.Getpid())
	if err := persist.WriteAtomic(filepath.Join(inbox, id+".json"), data); err != nil {
		return fmt.Errorf("injecting %s: %w", f, err)
	}
	result := filepath.Join(inbox, id+".result")
	for {
		data, err := os.ReadFile(result)
		if err == nil {
			os.Remove(result)
			var r faultResult
			if err := json.Unmarshal(data, &r); err != nil {
				return fmt.Errorf("injecting %s: unreadable answer: %w", f, err)
			}
			if r.Error != "" {
				return fmt.Errorf("injecting %s: %s", f, r.Error)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			os.Remove(filepath.Join(inbox, id+".json"))
			return fmt.Errorf("injecting %s: no answer from the process running the mock hardware in %s: %w", f, dir, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// inUse fails when the directory is a persistent mock's that no process
// holds (a temp mock's directory exists only while its process runs).
func inUse(dir string) error {
	persistent, held, err := persist.Held(dir)
	switch {
	case err != nil:
		return err
	case !persistent:
		if _, err := os.Stat(filepath.Join(dir, InboxDir)); err != nil {
			return fmt.Errorf("%s is no mock hardware directory: %w", dir, err)
		}
	case !held:
		return fmt.Errorf("no process runs the mock hardware in %s (start one with %s=%s)", dir, persist.DirEnv, dir)
	}
	return nil
}

// Inbox applies the faults other processes drop in a directory.
type Inbox struct {
	apply   func(Fault) error
	dir     string
	watcher *fsnotify.Watcher
	done    chan struct{}
	once    sync.Once
}

// Serve creates the inbox folder of the hardware's directory and applies
// each fault dropped there with apply, until Close.
func Serve(hardwareDir string, apply func(Fault) error) (*Inbox, error) {
	dir := filepath.Join(hardwareDir, InboxDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("mock: watching %s: %w", dir, err)
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, fmt.Errorf("mock: watching %s: %w", dir, err)
	}
	in := &Inbox{apply: apply, dir: dir, watcher: w, done: make(chan struct{})}
	go in.run()
	return in, nil
}

func (in *Inbox) run() {
	defer close(in.done)
	in.drain() // requests written before the watch began
	for {
		select {
		case ev, ok := <-in.watcher.Events:
			if !ok {
				return
			}
			if ev.Op&(fsnotify.Create|fsnotify.Rename) != 0 {
				in.drain()
			}
		case _, ok := <-in.watcher.Errors:
			if !ok {
				return
			}
			in.drain()
		}
	}
}

// drain applies every request in the folder, oldest first (names start
// with their time).
func (in *Inbox) drain() {
	entries, err := os.ReadDir(in.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") {
			continue
		}
		path := filepath.Join(in.dir, name)
		data, err := os.ReadFile(path)
		if err != nil {
			continue // taken back by its injector
		}
		os.Remove(path)
		var f Fault
		var r faultResult
		if err := json.Unmarshal(data, &f); err != nil {
			r.Error = fmt.Sprintf("unreadable fault: %v", err)
		} else if err := in.apply(f); err != nil {
			r.Error = err.Error()
		}
		out, _ := json.Marshal(r)
		// Unwritten, the injector times out waiting and says so.
		_ = persist.WriteAtomic(strings.TrimSuffix(path, ".json")+".result", out)
	}
}

// Close stops applying faults; a nil Inbox has nothing to stop.
func (in *Inbox) Close() {
	if in == nil {
		return
	}
	in.once.Do(func() {
		in.watcher.Close()
		<-in.done
	})
}
