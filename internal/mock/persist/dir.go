// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package persist

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/mock/profile"
)

// Reporter is what the node's mutating calls report to, after their change
// (ok) or refusal and before they return: a Dir saves the state and makes
// the call take the time its timings give it. device is the GPU's PCI
// address or the PF's netdev.
type Reporter interface {
	Changed(call, device string, ok bool)
}

// Part is a part of the node whose state is saved: it adds its own to a
// State, and takes it back from one.
type Part interface {
	Snapshot(s *State)
	Restore(s State) error
}

// Discard is the Reporter of hardware that neither saves nor paces (the
// parts tested alone).
var Discard Reporter = discard{}

type discard struct{}

func (discard) Changed(string, string, bool) {}

// Dir is a mock node's directory: its trees (sys, proc, dev) and, with
// DirEnv, its saved state, the busy markers of calls in progress and the
// lock that keeps other processes out. It is the node's Reporter.
type Dir struct {
	path       string
	persistent bool
	lock       *os.File // flock held while the directory is open
	profile    profile.Profile
	spec       json.RawMessage
	// saved is the state an earlier process left (nil: none); parts
	// are what the state is collected from (Start).
	saved *State
	parts []Part
	// timings by device (GPU PCI address, PF netdev), then call; env
	// overrides them for every device.
	timings map[string]map[string]time.Duration
	env     map[string]time.Duration
	// quiet until Start (building and restoring): no saves, no delays.
	quiet atomic.Bool
	seq   atomic.Uint64

	mu          sync.Mutex // serialises saves
	interrupted []Operation
	closed      bool

	// calls counts the calls reported since Start, by device then call
	// (State.Calls), continuing what an earlier process saved.
	callsMu sync.Mutex
	calls   map[string]map[string]int
}

// Open gives a node built from p its directory. With DirEnv set it is that
// directory, locked for this process, with the trees an earlier process
// left removed (the node rebuilds them, and Start applies the state that
// process saved). Otherwise it is a fresh temp directory. The Dir stays
// quiet until Start.
func Open(p profile.Profile, trees ...string) (*Dir, error) {
	d := &Dir{profile: p}
	d.quiet.Store(true)
	path := os.Getenv(DirEnv)
	if path == "" {
		var err error
		if d.path, err = TempDir(); err != nil {
			return nil, err
		}
		return d, nil
	}
	path, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	d.path, d.persistent = path, true
	if d.spec, err = profileSpec(p); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return nil, fmt.Errorf("%s=%s: %w", DirEnv, path, err)
	}
	if err := d.lockDir(); err != nil {
		return nil, err
	}
	if d.saved, err = d.loadSaved(); err != nil {
		return nil, errors.Join(err, d.Close())
	}
	var errs []error
	for _, tree := range append(trees, busyDir) {
		errs = append(errs, os.RemoveAll(filepath.Join(path, tree)))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(fmt.Errorf("mock hardware in %s: clearing the trees of an earlier process: %w", path, err), d.Close())
	}
	return d, nil
}

// TempDir makes a fresh directory where mock trees go. The kernel keeps
// sysfs in memory, and so does the mock where it can: on disk, building a
// vGPU host's thousands of sysfs files takes seconds. An explicit TMPDIR
// wins.
func TempDir() (string, error) {
	root := ""
	if os.Getenv("TMPDIR") == "" && unix.Access("/dev/shm", unix.W_OK) == nil {
		root = "/dev/shm"
	}
	return os.MkdirTemp(root, "hwdra-mock-")
}

// Path is the directory.
func (d *Dir) Path() string { return d.path }

// Persistent reports whether the directory keeps the node's state across
// processes (DirEnv).
func (d *Dir) Persistent() bool { return d.persistent }

// Start applies the state an earlier process saved to the freshly built
// parts, in order (GPUs before the vGPUs on them, ...), and ends the
// quiet: from now on each change is saved (persistent), collected from
// the parts, and paced by the profile's timings, which TimingsEnv
// overrides. devices are the node's GPUs (PCI addresses) and PFs
// (netdevs) in the profile's order, to which its groups' timings apply.
func (d *Dir) Start(devices []string, parts ...Part) error {
	if d.saved != nil {
		for _, p := range parts {
			if err := p.Restore(*d.saved); err != nil {
				return fmt.Errorf("mock hardware in %s: restoring its saved state: %w", d.path, err)
			}
		}
		d.calls = cloneCalls(d.saved.Calls)
	}
	env, err := envTimings()
	if err != nil {
		return err
	}
	d.parts, d.env = parts, env
	d.timings = map[string]map[string]time.Duration{}
	for _, g := range d.profile.GPUs {
		m, _ := g.Timings.Durations() // validated with the profile
		for range g.Count {
			d.timings[devices[0]], devices = m, devices[1:]
		}
	}
	for _, g := range d.profile.NICs {
		m, _ := g.Timings.Durations()
		for range g.Count {
			d.timings[devices[0]], devices = m, devices[1:]
		}
	}
	d.quiet.Store(false)
	if d.persistent {
		return d.save()
	}
	return nil
}

// Changed implements Reporter: the call is counted (Calls) and the state
// saved, then a successful call takes the time its timings give it,
// marked busy meanwhile. Calls while the node is built and restored
// (before Start) are neither counted nor saved.
func (d *Dir) Changed(call, device string, ok bool) {
	if d.quiet.Load() {
		return
	}
	d.count(call, device)
	if d.persistent {
		if err := d.save(); err != nil {
			// The call's change was made; there is no way to report a
			// failed save through NVML or netlink. Say it loudly.
			fmt.Fprintf(os.Stderr, "mock hardware: saving state after %s on %s: %v\n", call, device, err)
		}
	}
	if !ok {
		return
	}
	t, ok := d.env[call]
	if !ok {
		t = d.timings[device][call]
	}
	if t <= 0 {
		return
	}
	marker := d.markBusy(call, device)
	time.Sleep(t)
	if marker != "" {
		os.Remove(marker)
	}
}

func (d *Dir) count(call, device string) {
	d.callsMu.Lock()
	defer d.callsMu.Unlock()
	if d.calls == nil {
		d.calls = map[string]map[string]int{}
	}
	if d.calls[device] == nil {
		d.calls[device] = map[string]int{}
	}
	d.calls[device][call]++
}

// Calls is how many times each call reached each device since the node
// was first built (State.Calls), a copy.
func (d *Dir) Calls() map[string]map[string]int {
	d.callsMu.Lock()
	defer d.callsMu.Unlock()
	return cloneCalls(d.calls)
}

func cloneCalls(calls map[string]map[string]int) map[string]map[string]int {
	out := make(map[string]map[string]int, len(calls))
	for dev, byCall := range calls {
		out[dev] = maps.Clone(byCall)
	}
	return out
}

// save writes the state file atomically (temp file, rename). It is not
// fsynced: a process crash keeps the page cache, and a node that loses
// power loses real MIG instances and VF settings too.
func (d *Dir) save() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	var s State
	for _, p := range d.parts {
		p.Snapshot(&s)
	}
	s.Version, s.Profile, s.Spec, s.Interrupted = stateVersion, d.profile.Name, d.spec, d.interrupted
	s.Calls = d.Calls()
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return WriteAtomic(filepath.Join(d.path, stateFile), data)
}

// WriteAtomic writes a file of the mock's directory so that no reader,
// in this process or another, sees it half written (temp file, rename).
func WriteAtomic(path string, data []byte) error {
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
func (d *Dir) markBusy(call, device string) string {
	op := Operation{Call: call, Device: device, PID: os.Getpid(), Started: time.Now().UTC()}
	data, _ := json.Marshal(op)
	dir := filepath.Join(d.path, busyDir)
	path := filepath.Join(dir, fmt.Sprintf("%s.%d.%d", call, op.PID, d.seq.Add(1)))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return ""
	}
	if err := WriteAtomic(path, data); err != nil {
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

// lockDir takes the directory's lock: the kernel drops it when the process
// dies, SIGKILL included.
func (d *Dir) lockDir() error {
	f, err := os.OpenFile(filepath.Join(d.path, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("mock hardware in %s: %w", d.path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(f.Name())
		f.Close()
		return fmt.Errorf("mock hardware in %s is in use by another process (pid %s): %w", d.path, strings.TrimSpace(string(pid)), err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	d.lock = f
	return nil
}

// Held tells how a process would find dir: persistent is false for a
// directory without the lock file of a persistent mock (a temp mock's, or
// none), held whether a process holds a persistent one's lock.
func Held(dir string) (persistent, held bool, err error) {
	lock, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	defer lock.Close()
	if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
		_ = unix.Flock(int(lock.Fd()), unix.LOCK_UN) // closing the file below unlocks it anyway
		return true, false, nil
	}
	return true, true, nil
}

// loadSaved reads the state an earlier process left, nil if none, and
// moves that process's busy markers to the interrupted calls.
func (d *Dir) loadSaved() (*State, error) {
	leftovers, _ := filepath.Glob(filepath.Join(d.path, "."+stateFile+".tmp-*"))
	for _, l := range leftovers {
		os.Remove(l)
	}
	data, err := os.ReadFile(filepath.Join(d.path, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("mock hardware in %s: %w", d.path, err)
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("mock hardware in %s: state file unreadable (remove the directory to start afresh): %w", d.path, err)
	}
	if s.Version != stateVersion {
		return nil, fmt.Errorf("mock hardware in %s: state version %q, this build reads %q (remove the directory to start afresh)", d.path, s.Version, stateVersion)
	}
	if !bytes.Equal(compactJSON(s.Spec), compactJSON(d.spec)) {
		what := fmt.Sprintf("profile %q", s.Profile)
		if s.Profile == d.profile.Name {
			what += " as it was then"
		}
		return nil, fmt.Errorf("mock hardware in %s was built from %s, not from this profile %q: remove the directory or set %s to another one",
			d.path, what, d.profile.Name, DirEnv)
	}
	busy, _ := readBusy(d.path)
	d.interrupted = append(s.Interrupted, busy...)
	if n := len(d.interrupted); n > maxInterrupted {
		d.interrupted = d.interrupted[n-maxInterrupted:]
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
func profileSpec(p profile.Profile) (json.RawMessage, error) {
	p.GPUs = append([]profile.GPUGroup(nil), p.GPUs...)
	for i := range p.GPUs {
		p.GPUs[i].Timings = nil
	}
	p.NICs = append([]profile.NICGroup(nil), p.NICs...)
	for i := range p.NICs {
		p.NICs[i].Timings = nil
	}
	return json.Marshal(p)
}

// Close stops saving and releases the directory: a temp directory is
// removed, a persistent one kept and unlocked. A second Close does
// nothing.
func (d *Dir) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	if !d.persistent {
		return os.RemoveAll(d.path)
	}
	if d.lock != nil {
		err := d.lock.Close() // drops the flock
		d.lock = nil
		return err
	}
	return nil
}
