package mock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
)

// FaultKind names an injected fault.
type FaultKind string

const (
	// FaultXID raises an XID on a GPU (optionally confined to a MIG GPU
	// instance): the driver delivers it to NVML event sets and, unless it
	// is an application XID, asks for a GPU reset.
	FaultXID FaultKind = "xid"
	// FaultClear makes a GPU recover as a reset would: back on the bus,
	// no recovery action asked for.
	FaultClear FaultKind = "clear"
	// FaultGPULost makes a GPU fall off the bus (XID 79, then every NVML
	// lookup of it answers ERROR_GPU_IS_LOST).
	FaultGPULost FaultKind = "gpu-lost"
	// FaultLink takes a PF's link down or up.
	FaultLink FaultKind = "link"
	// FaultDriver loads (or unloads) the NVIDIA driver.
	FaultDriver FaultKind = "driver"
)

// Fault is one fault to inject into mock hardware.
type Fault struct {
	Kind FaultKind `json:"kind"`
	// GPU is a GPU's PCI address (xid, clear, gpu-lost).
	GPU string `json:"gpu,omitempty"`
	// XID is the XID's number (xid).
	XID uint64 `json:"xid,omitempty"`
	// GPUInstance and ComputeInstance confine an XID to one MIG instance.
	GPUInstance     *int `json:"gpuInstance,omitempty"`
	ComputeInstance *int `json:"computeInstance,omitempty"`
	// PF is a PF's netdev name or PCI address (link).
	PF string `json:"pf,omitempty"`
	// Up is the link's (link) or the driver's (driver) new state.
	Up bool `json:"up,omitempty"`
}

func (f Fault) String() string {
	switch f.Kind {
	case FaultXID:
		return fmt.Sprintf("XID %d on GPU %s", f.XID, f.GPU)
	case FaultLink:
		return fmt.Sprintf("link %s %s", f.PF, map[bool]string{true: "up", false: "down"}[f.Up])
	case FaultDriver:
		return fmt.Sprintf("driver %s", map[bool]string{true: "loaded", false: "unloaded"}[f.Up])
	}
	return fmt.Sprintf("%s on GPU %s", f.Kind, f.GPU)
}

// Inject applies a fault to this mock hardware.
func (h *Hardware) Inject(f Fault) error {
	switch f.Kind {
	case FaultXID, FaultClear, FaultGPULost:
		d, err := h.gpu(f.GPU)
		if err != nil {
			return err
		}
		switch f.Kind {
		case FaultXID:
			gi, ci := uint32(noInstance), uint32(noInstance)
			if f.GPUInstance != nil {
				gi = uint32(*f.GPUInstance)
			}
			if f.ComputeInstance != nil {
				if f.GPUInstance == nil {
					return errors.New("a compute instance needs its GPU instance")
				}
				ci = uint32(*f.ComputeInstance)
			}
			return d.xid(f.XID, gi, ci)
		case FaultClear:
			d.recover()
		case FaultGPULost:
			d.fallOffTheBus()
		}
		return nil
	case FaultLink:
		return h.SetLink(f.PF, f.Up)
	case FaultDriver:
		return h.SetDriverLoaded(f.Up)
	}
	return fmt.Errorf("unknown fault %q (known: %s, %s, %s, %s, %s)", f.Kind, FaultXID, FaultClear, FaultGPULost, FaultLink, FaultDriver)
}

// Faults reach the process that runs the hardware through its directory:
// the injector writes faults/<id>.json, the owner's inbox (watching the
// folder) applies it and answers faults/<id>.result.
const faultsDir = "faults"

// faultResult is the owner's answer.
type faultResult struct {
	Error string `json:"error,omitempty"`
}

// InjectDir injects a fault into the mock hardware in dir (a process's
// HWDRA_MOCK_DIR, or Hardware.Dir) while a process runs it, and waits for
// that process to apply it. It fails when no process runs it.
func InjectDir(ctx context.Context, dir string, f Fault) error {
	if err := inUse(dir); err != nil {
		return err
	}
	inbox := filepath.Join(dir, faultsDir)
	if _, err := os.Stat(inbox); err != nil {
		return fmt.Errorf("mock hardware in %s takes no faults (is it a mock directory of a running process?): %w", dir, err)
	}
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	id := fmt.Sprintf("%d-%d", time.Now().UnixNano(), os.Getpid())
	if err := writeAtomic(filepath.Join(inbox, id+".json"), data); err != nil {
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
	lock, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(filepath.Join(dir, faultsDir)); err != nil {
			return fmt.Errorf("%s is no mock hardware directory: %w", dir, err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	defer lock.Close()
	if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
		unix.Flock(int(lock.Fd()), unix.LOCK_UN)
		return fmt.Errorf("no process runs the mock hardware in %s (start one with %s=%s)", dir, DirEnv, dir)
	}
	return nil
}

// faultInbox applies the faults other processes drop in the directory.
type faultInbox struct {
	h       *Hardware
	dir     string
	watcher *fsnotify.Watcher
	done    chan struct{}
	once    sync.Once
}

// startInbox creates the inbox folder and watches it.
func (h *Hardware) startInbox() error {
	dir := filepath.Join(h.dir, faultsDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("mock: watching %s: %w", dir, err)
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return fmt.Errorf("mock: watching %s: %w", dir, err)
	}
	in := &faultInbox{h: h, dir: dir, watcher: w, done: make(chan struct{})}
	h.faults = in
	go in.run()
	return nil
}

func (in *faultInbox) run() {
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
func (in *faultInbox) drain() {
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
		} else if err := in.h.Inject(f); err != nil {
			r.Error = err.Error()
		}
		out, _ := json.Marshal(r)
		writeAtomic(strings.TrimSuffix(path, ".json")+".result", out)
	}
}

func (in *faultInbox) close() {
	if in == nil {
		return
	}
	in.once.Do(func() {
		in.watcher.Close()
		<-in.done
	})
}
