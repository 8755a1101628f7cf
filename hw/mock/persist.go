package mock

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/hw"
)

// DirEnv makes the mock hardware outlive the process, as real hardware
// outlives the agent: HWDRA_MOCK_DIR=/path puts the mock's trees (sys,
// proc, dev) in that directory instead of a fresh temp directory, keeps
// it at Close, and saves the hardware's state there after every change.
// A process that opens the directory later (the agent restarted after a
// SIGKILL) gets the hardware as the last one left it: MIG modes, GPU and
// compute instances (same IDs, profiles, placements, MIG UUIDs and
// capability files), processes set with SetRunningProcesses, mediated
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
	// VFs are every VF's settings, keyed "<PF netdev>/<VF index>" like
	// VFRecorder.Snapshot.
	VFs map[string]hw.VFConfig `json:"vfs,omitempty"`
	// LinksDown are the PF netdevs whose link is down.
	LinksDown []string `json:"linksDown,omitempty"`
	// DriverUnloaded: the NVIDIA driver is not loaded (SetDriverLoaded).
	DriverUnloaded bool `json:"driverUnloaded,omitempty"`
	// Interrupted are calls that were in progress (see GPUTimings) when
	// a process using the directory died: their change was made, their
	// caller never learnt it. The last 64, oldest first.
	Interrupted []Operation `json:"interrupted,omitempty"`
	// Busy are the calls in progress now (ReadState only, never saved).
	Busy []Operation `json:"-"`
}

// GPUState is one GPU.
type GPUState struct {
	BusID string   `json:"busID"`
	UUID  string   `json:"uuid"`
	MIG   MIGState `json:"mig"`
	// Processes are the PIDs SetRunningProcesses made run on the GPU.
	Processes    []uint32           `json:"processes,omitempty"`
	GPUInstances []GPUInstanceState `json:"gpuInstances,omitempty"`
	// NextSerial is the last compute instance's creation number (MIG
	// UUIDs derive from it, so a re-created instance gets a new one).
	NextSerial uint64 `json:"nextSerial,omitempty"`
	// Lost: the GPU fell off the bus (injected); RecoveryAction is the
	// driver's recovery action field (NVML's values, 0: none).
	Lost           bool   `json:"lost,omitempty"`
	RecoveryAction uint32 `json:"recoveryAction,omitempty"`
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

// Operation is a mock call in progress (or interrupted).
type Operation struct {
	// Call is a GPUTimings or NICTimings field's JSON name.
	Call string `json:"call"`
	// Device is the GPU's PCI address or the PF's netdev.
	Device  string    `json:"device"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
}

// Hardware is the state without what differs between equal hardware:
// the profile spec, creation counters, and calls in progress or
// interrupted. Compare these.
func (s State) Hardware() State {
	out := State{Version: s.Version, Profile: s.Profile, Mdevs: s.Mdevs, VFs: s.VFs,
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
	stateVersion = "hwdra.io/mock-state/v1"
	// maxInterrupted bounds State.Interrupted.
	maxInterrupted = 64
)

// control is what a mock node's mutating calls report to: it saves the
// state after each change (persistent mock) and makes the call take its
// time (timings). Nil is a valid control that does neither.
type control struct {
	h          *Hardware
	dir        string
	persistent bool
	lock       *os.File // flock held while the directory is open
	spec       json.RawMessage
	// timings by device (GPU PCI address, PF netdev), then call; env
	// overrides them for every device.
	timings map[string]map[string]time.Duration
	env     map[string]time.Duration
	// quiet while building and restoring: no saves, no delays.
	quiet atomic.Bool
	seq   atomic.Uint64

	mu          sync.Mutex // serialises saves
	interrupted []Operation
	closed      bool
}

// changed is called by a mutating call after its change (ok) or refusal,
// before it returns: the state is saved, then a successful call takes the
// time its timings give it, marked busy meanwhile.
func (c *control) changed(call, device string, ok bool) {
	if c == nil || c.quiet.Load() || !ok {
		return
	}
	if c.persistent {
		if err := c.save(); err != nil {
			// The call's change was made; there is no way to report a
			// failed save through NVML or netlink. Say it loudly.
			fmt.Fprintf(os.Stderr, "mock hardware: saving state after %s on %s: %v\n", call, device, err)
		}
	}
	d, ok := c.env[call]
	if !ok {
		d = c.timings[device][call]
	}
	if d <= 0 {
		return
	}
	marker := c.markBusy(call, device)
	time.Sleep(d)
	if marker != "" {
		os.Remove(marker)
	}
}

// save writes the state file atomically (temp file, rename). It is not
// fsynced: a process crash keeps the page cache, and a node that loses
// power loses real MIG instances and VF settings too.
func (c *control) save() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	s := c.h.snapshot()
	s.Version, s.Profile, s.Spec, s.Interrupted = stateVersion, c.h.Profile.Name, c.spec, c.interrupted
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(c.dir, stateFile), data)
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	_, err = tmp.Write(data)
	if err = errors.Join(err, tmp.Close()); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// markBusy writes busy/<call>.<pid>.<n>; it returns its path, "" when it
// could not.
func (c *control) markBusy(call, device string) string {
	op := Operation{Call: call, Device: device, PID: os.Getpid(), Started: time.Now().UTC()}
	data, _ := json.Marshal(op)
	dir := filepath.Join(c.dir, busyDir)
	path := filepath.Join(dir, fmt.Sprintf("%s.%d.%d", call, op.PID, c.seq.Add(1)))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return ""
	}
	if err := writeAtomic(path, data); err != nil {
		return ""
	}
	return path
}

// readBusy lists the busy markers, oldest first.
func readBusy(dir string) ([]Operation, error) {
	entries, err := os.ReadDir(filepath.Join(dir, busyDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Operation
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue // a marker being written
		}
		data, err := os.ReadFile(filepath.Join(dir, busyDir, e.Name()))
		if err != nil {
			continue // its call just returned
		}
		var op Operation
		if json.Unmarshal(data, &op) == nil {
			out = append(out, op)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out, nil
}

// openDir gives h its directory and control. With DirEnv set it is that
// directory, locked for this process, with the trees of an earlier one
// removed (they are rebuilt, then its saved state, returned, is applied).
func (h *Hardware) openDir() (*State, error) {
	c := &control{h: h}
	h.ctl = c
	dir := os.Getenv(DirEnv)
	if dir == "" {
		d, err := os.MkdirTemp(tempRoot(), "hwdra-mock-")
		if err != nil {
			return nil, err
		}
		h.dir, c.dir = d, d
		return nil, nil
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	h.dir, c.dir, c.persistent = dir, dir, true
	if c.spec, err = profileSpec(h.Profile); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%s=%s: %w", DirEnv, dir, err)
	}
	if err := c.lockDir(); err != nil {
		return nil, err
	}
	saved, err := c.loadSaved()
	if err != nil {
		return nil, errors.Join(err, c.close())
	}
	var errs []error
	for _, tree := range []string{"sys", "proc", "dev", busyDir, faultsDir} {
		errs = append(errs, os.RemoveAll(filepath.Join(dir, tree)))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(fmt.Errorf("mock hardware in %s: clearing the trees of an earlier process: %w", dir, err), c.close())
	}
	return saved, nil
}

// lockDir takes the directory's lock: the kernel drops it when the process
// dies, SIGKILL included.
func (c *control) lockDir() error {
	f, err := os.OpenFile(filepath.Join(c.dir, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("mock hardware in %s: %w", c.dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(f.Name())
		f.Close()
		return fmt.Errorf("mock hardware in %s is in use by another process (pid %s): %w", c.dir, strings.TrimSpace(string(pid)), err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	c.lock = f
	return nil
}

// loadSaved reads the state an earlier process left, nil if none, and
// moves that process's busy markers to the interrupted calls.
func (c *control) loadSaved() (*State, error) {
	leftovers, _ := filepath.Glob(filepath.Join(c.dir, "."+stateFile+".tmp-*"))
	for _, l := range leftovers {
		os.Remove(l)
	}
	data, err := os.ReadFile(filepath.Join(c.dir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("mock hardware in %s: %w", c.dir, err)
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("mock hardware in %s: state file unreadable (remove the directory to start afresh): %w", c.dir, err)
	}
	if s.Version != stateVersion {
		return nil, fmt.Errorf("mock hardware in %s: state version %q, this build reads %q (remove the directory to start afresh)", c.dir, s.Version, stateVersion)
	}
	if !bytes.Equal(compactJSON(s.Spec), compactJSON(c.spec)) {
		what := fmt.Sprintf("profile %q", s.Profile)
		if s.Profile == c.h.Profile.Name {
			what += " as it was then"
		}
		return nil, fmt.Errorf("mock hardware in %s was built from %s, not from this profile %q: remove the directory or set %s to another one",
			c.dir, what, c.h.Profile.Name, DirEnv)
	}
	busy, _ := readBusy(c.dir)
	c.interrupted = append(s.Interrupted, busy...)
	if n := len(c.interrupted); n > maxInterrupted {
		c.interrupted = c.interrupted[n-maxInterrupted:]
	}
	return &s, nil
}

func compactJSON(b []byte) []byte {
	var out bytes.Buffer
	if json.Compact(&out, b) != nil {
		return b
	}
	return out.Bytes()
}

// profileSpec is the profile as JSON without its timings.
func profileSpec(p Profile) (json.RawMessage, error) {
	p.GPUs = append([]GPUGroup(nil), p.GPUs...)
	for i := range p.GPUs {
		p.GPUs[i].Timings = nil
	}
	p.NICs = append([]NICGroup(nil), p.NICs...)
	for i := range p.NICs {
		p.NICs[i].Timings = nil
	}
	return json.Marshal(p)
}

// start finishes New: it applies a saved state to the freshly built
// hardware, installs the timings and saves the state.
func (h *Hardware) start(saved *State) error {
	c := h.ctl
	h.NICs().recorder.setControl(c)
	if saved != nil {
		if err := h.restore(*saved); err != nil {
			return fmt.Errorf("mock hardware in %s: restoring its saved state: %w", c.dir, err)
		}
	}
	if err := c.installTimings(); err != nil {
		return err
	}
	c.quiet.Store(false)
	if c.persistent {
		return c.save()
	}
	return nil
}

// installTimings resolves the profile's timings per device and the
// environment's.
func (c *control) installTimings() error {
	var err error
	if c.env, err = envTimings(); err != nil {
		return err
	}
	c.timings = map[string]map[string]time.Duration{}
	if s, ok := c.h.NVML.(*server.Server); ok {
		i := 0
		for _, g := range c.h.Profile.GPUs {
			m, _ := timingMap(g.Timings) // validated with the profile
			for range g.Count {
				c.timings[s.Devices[i].(*gpuDevice).busID] = m
				i++
			}
		}
	}
	pfs := c.h.NICs().pfs
	i := 0
	for _, g := range c.h.Profile.NICs {
		m, _ := timingMap(g.Timings)
		for range g.Count {
			if i < len(pfs) {
				c.timings[pfs[i].netdev] = m
			}
			i++
		}
	}
	return nil
}

// close stops saving and releases the directory: a temp directory is
// removed, a persistent one kept and unlocked.
func (c *control) close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if !c.persistent {
		return os.RemoveAll(c.dir)
	}
	if c.lock != nil {
		err := c.lock.Close() // drops the flock
		c.lock = nil
		return err
	}
	return nil
}

// Dir is the directory the mock lives in: its trees and, with DirEnv, its
// saved state.
func (h *Hardware) Dir() string { return h.dir }

// Persistent reports whether the mock keeps its state across processes
// (DirEnv).
func (h *Hardware) Persistent() bool { return h.ctl != nil && h.ctl.persistent }

// snapshot collects the state of every part of the node.
func (h *Hardware) snapshot() State {
	var s State
	if srv, ok := h.NVML.(*server.Server); ok {
		for _, dev := range srv.Devices {
			s.GPUs = append(s.GPUs, dev.(*gpuDevice).snapshot())
		}
		sort.Slice(s.GPUs, func(i, j int) bool { return s.GPUs[i].BusID < s.GPUs[j].BusID })
		if len(srv.Devices) > 0 {
			s.Mdevs = srv.Devices[0].(*gpuDevice).kernel.snapshot()
		}
	}
	if vfs := h.NICs().recorder.Snapshot(); len(vfs) > 0 {
		s.VFs = vfs
	}
	s.LinksDown = h.NICs().linksDown()
	s.DriverUnloaded = h.driver != nil && h.driver.unloaded.Load()
	return s
}

// restore applies a saved state to freshly built hardware: GPUs first
// (MIG modes, instances), then the vGPUs on them, then the VFs.
func (h *Hardware) restore(s State) error {
	srv, _ := h.NVML.(*server.Server)
	if h.driver != nil {
		h.driver.unloaded.Store(s.DriverUnloaded)
	}
	for _, g := range s.GPUs {
		if srv == nil {
			return fmt.Errorf("GPU %s: the profile has no GPUs", g.BusID)
		}
		d, err := h.gpu(g.BusID)
		if err != nil {
			return err
		}
		if err := d.restore(g); err != nil {
			return fmt.Errorf("GPU %s: %w", g.BusID, err)
		}
		d.notify()
	}
	if len(s.Mdevs) > 0 {
		if srv == nil || len(srv.Devices) == 0 || srv.Devices[0].(*gpuDevice).kernel == nil {
			return fmt.Errorf("mediated devices saved, but the profile has no vGPU host")
		}
		if err := srv.Devices[0].(*gpuDevice).kernel.restore(s.Mdevs); err != nil {
			return err
		}
	}
	if err := h.NICs().restoreLinks(s.LinksDown); err != nil {
		return err
	}
	return h.NICs().recorder.restore(s.VFs)
}
