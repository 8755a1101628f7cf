package prepare

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/slotfile"
)

// ledger is a Driver over a pretend piece of hardware that holds named
// resources; it exercises the plugin's bookkeeping, not any real driver.
type ledger struct {
	held          map[string]bool // resource -> exists on the "hardware"
	failAfter     int             // fail Prepare after this many side effects (0: never)
	failUnprepare bool            // Unprepare undoes the first resource, then fails
	undone        []string
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

func (l *ledger) Reconcile(ctx context.Context, owned map[types.UID]record) error {
	keep := map[string]bool{}
	for _, r := range owned {
		for _, res := range r.Resources {
			keep[res] = true
		}
	}
	for res := range l.held {
		if !keep[res] {
			delete(l.held, res)
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

func testClaim(uid string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-" + uid, UID: types.UID(uid)}}
}

func newPlugin(t *testing.T, l *ledger, dir, boot string) *Plugin[record] {
	t.Helper()
	p, err := New[record](context.Background(), l, Options{DriverName: "test.hwdra.io", StateDir: filepath.Join(dir, "state"), CDIDir: filepath.Join(dir, "cdi"), BootID: boot})
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
		"unknown version": `{"version":"hwdra.io/checkpoint/v9","checksum":"x","data":{}}`,
		"bad checksum":    `{"version":"hwdra.io/checkpoint/v1","checksum":"sha256:00","data":{"bootID":"b","claims":{}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			os.MkdirAll(filepath.Join(dir, "state"), 0o755)
			path := filepath.Join(dir, "state", "test.hwdra.io.checkpoint.json")
			slotfile.Replace(path, []byte(content))
			newPlugin(t, &ledger{held: map[string]bool{}}, dir, "boot-1")
			matches, _ := filepath.Glob(path + ".corrupt-*")
			if len(matches) != 1 {
				t.Fatalf("corrupt file not set aside: %v", matches)
			}
			if _, err := readCheckpoint[record](path); err != nil {
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
