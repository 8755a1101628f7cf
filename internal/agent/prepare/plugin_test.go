// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package prepare

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/state"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// ledger is a Driver over a pretend piece of hardware that holds named
// resources; it exercises the plugin's bookkeeping, not any real driver.
type ledger struct {
	mu            sync.Mutex      // Reclaim runs in the background
	held          map[string]bool // resource -> exists on the "hardware"
	failAfter     int             // fail Prepare after this many side effects (0: never)
	failUnprepare bool            // Unprepare undoes the first resource, then fails
	undone        []string
	owned         map[string]bool // resources of the claims Restore was given
}

type record struct {
	Resources []string `json:"resources"`
}

func (l *ledger) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim, save func(record) error) ([]Device, record, error) {
	var r record
	for i, name := range []string{"a", "b", "c"} {
		res := string(claim.UID) + "/" + name
		r.Resources = append(r.Resources, res)
		if err := save(r); err != nil {
			return nil, r, err
		}
		if l.failAfter > 0 && i == l.failAfter {
			return nil, r, errors.New("injected failure")
		}
		l.held[res] = true
	}
	return []Device{{Requests: []string{"req"}, Pool: "node", Device: "dev-0",
		Edits:      &cdispec.ContainerEdits{Env: []string{"X=1"}},
		Attributes: map[string]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr("u")}}}}, r, nil
}

func (l *ledger) Unprepare(ctx context.Context, uid types.UID, r record) error {
	for i, res := range r.Resources {
		if l.failUnprepare && i == 1 {
			return errors.New("injected unprepare failure")
		}
		if l.held[res] {
			delete(l.held, res)
			l.undone = append(l.undone, res)
		}
	}
	return nil
}

func (l *ledger) Restore(_ context.Context, owned map[types.UID]record) {
	l.owned = map[string]bool{}
	for _, r := range owned {
		for _, res := range r.Resources {
			l.owned[res] = true
		}
	}
}

// Reclaim removes what no restored claim holds, keeping what an allocated
// claim's UID prefixes (resources are "<claim UID>/<name>").
func (l *ledger) Reclaim(ctx context.Context, allocated Allocated) ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var kept []string
	for res := range l.held {
		if l.owned[res] {
			continue
		}
		uid, _, _ := strings.Cut(res, "/")
		if !allocated.Known || slices.ContainsFunc(allocated.Devices, func(d AllocatedDevice) bool { return string(d.Claim) == uid }) {
			kept = append(kept, res)
			continue
		}
		delete(l.held, res)
	}
	return kept, nil
}

func (l *ledger) heldNow(res string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held[res]
}

func (l *ledger) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

func ptr[T any](v T) *T { return &v }

func testClaim(uid string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-" + uid, UID: types.UID(uid)}}
}

func newPlugin(t *testing.T, l *ledger, dir, boot string) *Plugin[record] {
	t.Helper()
	return newPluginWith(t, l, Options{DriverName: "test.hwdra.io", StateDir: filepath.Join(dir, "state"), CDIDir: filepath.Join(dir, "cdi"), BootID: boot})
}

func newPluginWith(t *testing.T, l *ledger, opts Options) *Plugin[record] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // stops the plugin's background reclaim
	p, err := New[record](ctx, l, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPrepareIsIdempotentAndUnprepareUndoes(t *testing.T) {
	dir := t.TempDir()
	l := &ledger{held: map[string]bool{}}
	p := newPlugin(t, l, dir, "boot-1")
	ctx := context.Background()
	first, err := p.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{testClaim("u1")})
	if err != nil || first["u1"].Err != nil {
		t.Fatal(err, first["u1"].Err)
	}
	if len(l.held) != 3 {
		t.Fatalf("held %v", l.held)
	}
	l.held["sentinel"] = true // a repeated prepare must not touch hardware
	second, _ := p.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{testClaim("u1")})
	if got, want := second["u1"].Devices[0].CDIDeviceIDs, first["u1"].Devices[0].CDIDeviceIDs; len(got) != 1 || got[0] != want[0] {
		t.Fatalf("second prepare returned %v, first %v", got, want)
	}
	if len(l.held) != 4 {
		t.Fatalf("second prepare changed hardware: %v", l.held)
	}
	if _, err := os.Stat(filepath.Join(dir, "cdi", "test.hwdra.io_claim_u1.json")); err != nil {
		t.Fatal(err)
	}
	res, _ := p.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "u1"}, {UID: "never-prepared"}})
	if res["u1"] != nil || res["never-prepared"] != nil {
		t.Fatal(res)
	}
	if len(l.held) != 1 {
		t.Fatalf("unprepare left %v", l.held)
	}
	if _, err := os.Stat(filepath.Join(dir, "cdi", "test.hwdra.io_claim_u1.json")); !os.IsNotExist(err) {
		t.Fatalf("CDI spec left behind: %v", err)
	}
}

func TestFailedPrepareRollsBack(t *testing.T) {
	l := &ledger{held: map[string]bool{}, failAfter: 2}
	p := newPlugin(t, l, t.TempDir(), "boot-1")
	res, _ := p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{testClaim("u1")})
	if err := res["u1"].Err; err == nil || !strings.Contains(err.Error(), "claim ns/c-u1: injected failure") {
		t.Fatalf("want the driver's error naming the claim, got %v", err)
	}
	if len(l.held) != 0 || len(l.undone) != 2 {
		t.Fatalf("held %v, undone %v", l.held, l.undone)
	}
	if len(p.Prepared()) != 0 {
		t.Fatal("failed claim recorded as prepared")
	}
}

func TestRestartRollsBackHalfPreparedAndReclaims(t *testing.T) {
	dir := t.TempDir()
	l := &ledger{held: map[string]bool{}}
	p := newPlugin(t, l, dir, "boot-1")
	ctx := context.Background()
	if res, _ := p.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{testClaim("done")}); res["done"].Err != nil {
		t.Fatal(res["done"].Err)
	}
	// A crash in the middle of a second prepare: the record says Preparing.
	entry := &Claim[record]{Namespace: "ns", Name: "c-half", State: StatePreparing, Record: record{Resources: []string{"half/a", "half/b"}}}
	if err := p.store("half", entry); err != nil {
		t.Fatal(err)
	}
	l.held["half/a"] = true
	l.held["stray"] = true // created, then crashed before any record
	os.WriteFile(filepath.Join(dir, "cdi", "test.hwdra.io_claim_gone.json"), []byte("{}"), 0o644)

	p2 := newPlugin(t, l, dir, "boot-1")
	if got := p2.Prepared(); len(got) != 1 || got[0] != "done" {
		t.Fatalf("prepared after restart: %v", got)
	}
	if l.held["half/a"] || l.held["stray"] || !l.held["done/a"] {
		t.Fatalf("hardware after restart: %v", l.held)
	}
	if _, err := os.Stat(filepath.Join(dir, "cdi", "test.hwdra.io_claim_gone.json")); !os.IsNotExist(err) {
		t.Fatal("orphaned CDI spec kept")
	}
	if _, err := os.Stat(filepath.Join(dir, "cdi", "test.hwdra.io_claim_done.json")); err != nil {
		t.Fatal("prepared claim's CDI spec removed")
	}
}

func TestCorruptCheckpointIsSetAside(t *testing.T) {
	for name, content := range map[string]string{
		"garbage":         "{not json",
		"unknown version": `{"version":"checkpoint-from-elsewhere","checksum":"x","data":{}}`,
		"bad checksum":    `{"version":"hwdra.io/checkpoint/v1","checksum":"sha256:00","data":{"bootID":"b","claims":{}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			os.MkdirAll(filepath.Join(dir, "state"), 0o755)
			path := filepath.Join(dir, "state", "test.hwdra.io.checkpoint.json")
			state.Replace(path, []byte(content))
			newPlugin(t, &ledger{held: map[string]bool{}}, dir, "boot-1")
			matches, _ := filepath.Glob(path + ".corrupt-*")
			if len(matches) != 1 {
				t.Fatalf("corrupt file not set aside: %v", matches)
			}
			if _, err := state.Read(path, state.CheckpointFormat); err != nil {
				t.Fatalf("fresh checkpoint unreadable: %v", err)
			}
		})
	}
}

func TestRebootForgetsClaims(t *testing.T) {
	dir := t.TempDir()
	l := &ledger{held: map[string]bool{}}
	p := newPlugin(t, l, dir, "boot-1")
	p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{testClaim("u1")})
	l.held = map[string]bool{} // a reboot wipes hardware state
	p2 := newPlugin(t, l, dir, "boot-2")
	if len(p2.Prepared()) != 0 {
		t.Fatal("claims survived a reboot")
	}
}

// TestHalfFailedUnprepareKeepsTheClaimUsable: when the driver cannot undo
// everything, the claim stays prepared with its CDI spec, so a prepare (for
// another pod) gets devices whose spec exists, and a retried unprepare
// finishes the job.
func TestHalfFailedUnprepareKeepsTheClaimUsable(t *testing.T) {
	dir := t.TempDir()
	l := &ledger{held: map[string]bool{}}
	p := newPlugin(t, l, dir, "boot-1")
	ctx := context.Background()
	spec := filepath.Join(dir, "cdi", "test.hwdra.io_claim_u1.json")
	if res, err := p.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{testClaim("u1")}); err != nil || res["u1"].Err != nil {
		t.Fatal(err, res["u1"].Err)
	}
	l.failUnprepare = true
	if res, _ := p.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "u1"}}); res["u1"] == nil {
		t.Fatal("unprepare did not report the failure")
	}
	if _, err := os.Stat(spec); err != nil {
		t.Fatalf("the CDI spec went with a failed unprepare: %v", err)
	}
	again, _ := p.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{testClaim("u1")})
	if again["u1"].Err != nil || len(again["u1"].Devices) != 1 || len(again["u1"].Devices[0].CDIDeviceIDs) != 1 {
		t.Fatalf("prepare after the failed unprepare: %+v", again["u1"])
	}
	l.failUnprepare = false
	if res, _ := p.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "u1"}}); res["u1"] != nil {
		t.Fatal(res["u1"])
	}
	if _, err := os.Stat(spec); !os.IsNotExist(err) || len(l.held) != 0 || len(p.Prepared()) != 0 {
		t.Fatalf("after the retried unprepare: spec %v, hardware %v, prepared %v", err, l.held, p.Prepared())
	}
}

func prepareOK(t *testing.T, p *Plugin[record], uid string) kubeletplugin.PrepareResult {
	t.Helper()
	res, err := p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{testClaim(uid)})
	if err != nil || res[types.UID(uid)].Err != nil {
		t.Fatal(err, res[types.UID(uid)].Err)
	}
	return res[types.UID(uid)]
}

func unprepareOK(t *testing.T, p *Plugin[record], uid string) {
	t.Helper()
	res, err := p.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: types.UID(uid)}})
	if err != nil || res[types.UID(uid)] != nil {
		t.Fatal(err, res[types.UID(uid)])
	}
}

// TestLostStateIsRebuiltFromTheSpecs: with the state directory corrupted
// or deleted between prepare and unprepare, the agent rebuilds its claims
// from their CDI specs: the hardware stays as the claims left it, a
// repeated prepare answers as before, and unprepare cleans up exactly.
func TestLostStateIsRebuiltFromTheSpecs(t *testing.T) {
	for name, lose := range map[string]func(t *testing.T, state string){
		"state directory deleted": func(t *testing.T, state string) { os.RemoveAll(state) },
		"every state file corrupt": func(t *testing.T, state string) {
			files, _ := filepath.Glob(filepath.Join(state, "*"))
			for _, f := range files {
				os.WriteFile(f, []byte("{garbage"), 0o600)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			l := &ledger{held: map[string]bool{}}
			p := newPlugin(t, l, dir, "boot-1")
			first := prepareOK(t, p, "u1")
			prepareOK(t, p, "u2")
			before := maps.Clone(l.held)
			lose(t, filepath.Join(dir, "state"))
			p = newPlugin(t, l, dir, "boot-1")
			if !maps.Equal(l.held, before) {
				t.Fatalf("hardware after the restart %v, was %v", l.held, before)
			}
			if got := p.Prepared(); len(got) != 2 {
				t.Fatalf("prepared after the restart: %v", got)
			}
			l.held["sentinel"] = true // a repeated prepare touches nothing
			if again := prepareOK(t, p, "u1"); !slices.Equal(again.Devices[0].CDIDeviceIDs, first.Devices[0].CDIDeviceIDs) {
				t.Fatalf("repeated prepare: %v, first %v", again.Devices, first.Devices)
			}
			delete(l.held, "sentinel")
			unprepareOK(t, p, "u1")
			unprepareOK(t, p, "u2")
			if len(l.held) != 0 {
				t.Fatalf("left on the hardware: %v", l.held)
			}
			if specs, _ := filepath.Glob(filepath.Join(dir, "cdi", "*")); len(specs) != 0 {
				t.Fatalf("CDI specs left: %v", specs)
			}
			prepareOK(t, p, "u3") // new claims prepare
		})
	}
}

// TestNewerCheckpointIsLeftAlone: after a downgrade the older agent never
// overwrites or moves the newer agent's checkpoint; it keeps its own beside
// it and rebuilds its claims.
func TestNewerCheckpointIsLeftAlone(t *testing.T) {
	dir := t.TempDir()
	l := &ledger{held: map[string]bool{}}
	p := newPlugin(t, l, dir, "boot-1")
	prepareOK(t, p, "u1")
	path := filepath.Join(dir, "state", "test.hwdra.io.checkpoint.json")
	newerFile := []byte(`{"version":"hwdra.io/checkpoint/v4","checksum":"sha256:x","data":{"claims":{}}}`)
	if err := state.Replace(path, newerFile); err != nil {
		t.Fatal(err)
	}
	p = newPlugin(t, l, dir, "boot-1")
	if got := p.Prepared(); len(got) != 1 {
		t.Fatalf("prepared after the downgrade: %v", got)
	}
	prepareOK(t, p, "u2")
	unprepareOK(t, p, "u1")
	p = newPlugin(t, l, dir, "boot-1") // and again: its own file now
	if got := p.Prepared(); len(got) != 1 || got[0] != "u2" {
		t.Fatalf("prepared after a restart: %v", got)
	}
	if raw, err := os.ReadFile(path); err != nil || string(raw) != string(newerFile) {
		t.Fatalf("the newer checkpoint changed: %q %v", raw, err)
	}
	if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) != 0 {
		t.Fatalf("the newer checkpoint was set aside: %v", m)
	}
}

// clusterFunc is a Cluster of one function.
type clusterFunc func(context.Context) ([]*resourceapi.ResourceClaim, error)

func (f clusterFunc) AllocatedClaims(ctx context.Context) ([]*resourceapi.ResourceClaim, error) {
	return f(ctx)
}

// TestReclaimKeepsWhatAllocatedClaimsMayUse: state left with no record at
// all (checkpoint and CDI spec lost) is kept while the API server says a
// claim allocated to the node may use it, or cannot be asked, and
// removed once no allocated claim can own it.
func TestReclaimKeepsWhatAllocatedClaimsMayUse(t *testing.T) {
	dir := t.TempDir()
	l := &ledger{held: map[string]bool{"u1/a": true, "u1/b": true, "gone/a": true}}
	var allocated atomic.Pointer[[]*resourceapi.ResourceClaim]
	listErr := errors.New("API server unreachable")
	var fail atomic.Bool
	fail.Store(true)
	var asked atomic.Int32 // each reclaim asks once, first
	list := clusterFunc(func(context.Context) ([]*resourceapi.ResourceClaim, error) {
		asked.Add(1)
		if fail.Load() {
			return nil, listErr
		}
		return *allocated.Load(), nil
	})
	c := testClaim("u1")
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "req", Driver: "test.hwdra.io", Pool: "node", Device: "dev-0"},
	}}}
	claims := []*resourceapi.ResourceClaim{c}
	allocated.Store(&claims)
	newPluginWith(t, l, Options{DriverName: "test.hwdra.io", StateDir: filepath.Join(dir, "state"), CDIDir: filepath.Join(dir, "cdi"),
		BootID: "boot-1", Cluster: list, ReclaimInterval: 10 * time.Millisecond})
	// The first reclaim ran in New; the third ask comes after the first
	// background one ended (or something went: no need to wait).
	waitfor.True(t, "a background reclaim while the API server cannot be asked", 10*time.Second, func() bool { return asked.Load() >= 3 || l.size() != 3 })
	if n := l.size(); n != 3 {
		t.Fatalf("removed while the API server could not be asked: %d of 3 held", n)
	}
	fail.Store(false)
	waitfor.True(t, "the unallocated claim's state is reclaimed", 10*time.Second, func() bool { return !l.heldNow("gone/a") })
	if !l.heldNow("u1/a") || !l.heldNow("u1/b") {
		t.Fatalf("the allocated claim's state was reclaimed: %v", l.held)
	}
	none := []*resourceapi.ResourceClaim{}
	allocated.Store(&none)
	waitfor.True(t, "the deallocated claim's state is reclaimed", 10*time.Second, func() bool { return l.size() == 0 })
}

// TestPrepareRefusesConfigsNoDriverReads: a claim configured for a
// driver that owns none of its devices (a typo of hwdra's, NVIDIA's
// gpu.nvidia.com) is refused, the config named with the likely fix,
// nothing recorded; the same claim without it prepares.
func TestPrepareRefusesConfigsNoDriverReads(t *testing.T) {
	p := newPlugin(t, &ledger{held: map[string]bool{}}, t.TempDir(), "boot-1")
	for driver, want := range map[string]string{
		"gpu.hwdra.com":  "spec.devices.config[0] is for driver gpu.hwdra.com, which owns none of the devices it applies to (test.hwdra.io): no driver reads it (did you mean gpu.hwdra.io?)",
		"gpu.nvidia.com": "spec.devices.config[0] is for driver gpu.nvidia.com, which owns none of the devices it applies to (test.hwdra.io): no driver reads it (written for NVIDIA's GPU DRA driver: `hwdra convert` rewrites",
	} {
		c := testClaim("u1")
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "test.hwdra.io", Pool: "node", Device: "dev-0"}},
			Config: []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim, DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(`{}`)}}}}},
		}}
		res, err := p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
		if err != nil {
			t.Fatal(err)
		}
		if got := res["u1"].Err; got == nil || !strings.Contains(got.Error(), want) {
			t.Errorf("%s: %v, want %q", driver, got, want)
		}
		if _, ok := p.Claims()["u1"]; ok {
			t.Errorf("%s: the claim is recorded prepared", driver)
		}
		c.Status.Allocation.Devices.Config = nil
		if res, err := p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c}); err != nil || res["u1"].Err != nil {
			t.Fatal(err, res["u1"].Err)
		}
		if _, err := p.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}}); err != nil {
			t.Fatal(err)
		}
	}
}
