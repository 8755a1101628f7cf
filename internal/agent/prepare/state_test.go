// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package prepare

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/state"
)

// testdata/v1 is what main (766ef49) wrote for this package's test driver
// after preparing u1 and u2 and unpreparing u2: the checkpoint's two
// slots (the newer holds u1 alone) and u1's CDI spec, whose annotation
// had no version.
func copyMainState(t *testing.T, dir string, checkpoint bool) {
	t.Helper()
	files := map[string]string{"test.hwdra.io_claim_u1.json": "cdi"}
	if checkpoint {
		files["test.hwdra.io.checkpoint.json"] = "state"
		files["test.hwdra.io.checkpoint.json.1"] = "state"
	}
	for name, sub := range files {
		data, err := os.ReadFile(filepath.Join("testdata", "v1", name))
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Join(dir, sub), 0o755)
		if err := os.WriteFile(filepath.Join(dir, sub, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMainsStateIsMigrated: an agent upgraded from main serves the claims
// main prepared, from its checkpoint or, with that lost, from their CDI
// specs, and unprepares them exactly.
func TestMainsStateIsMigrated(t *testing.T) {
	for _, checkpoint := range []bool{true, false} {
		t.Run(map[bool]string{true: "checkpoint", false: "checkpoint lost"}[checkpoint], func(t *testing.T) {
			dir := t.TempDir()
			copyMainState(t, dir, checkpoint)
			l := &ledger{held: map[string]bool{"u1/a": true, "u1/b": true, "u1/c": true}}
			p := newPlugin(t, l, dir, "boot-1")
			if got := p.Prepared(); !slices.Equal(got, []types.UID{"u1"}) {
				t.Fatalf("prepared: %v", got)
			}
			want := Claim[record]{Namespace: "ns", Name: "c-u1", State: StatePrepared, Record: record{Resources: []string{"u1/a", "u1/b", "u1/c"}}}
			got := p.Claims()["u1"]
			got.Devices = nil
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("claim %+v, want %+v", got, want)
			}
			again := prepareOK(t, p, "u1")
			if len(l.held) != 3 || !slices.Equal(again.Devices[0].CDIDeviceIDs, []string{"test.hwdra.io/claim=u1-dev-0"}) {
				t.Fatalf("repeated prepare: %+v, hardware %v", again.Devices, l.held)
			}
			// Written in the current version at start.
			if data, err := state.Read(filepath.Join(dir, "state", "test.hwdra.io.checkpoint.json"), state.CheckpointFormat); err != nil || !strings.Contains(string(data), `"u1"`) {
				t.Fatalf("checkpoint after the start: %s %v", data, err)
			}
			unprepareOK(t, p, "u1")
			if len(l.held) != 0 {
				t.Fatalf("left on the hardware: %v", l.held)
			}
			if specs, _ := filepath.Glob(filepath.Join(dir, "cdi", "*")); len(specs) != 0 {
				t.Fatalf("CDI specs left: %v", specs)
			}
			prepareOK(t, p, "u3")
			if a := annotation(t, filepath.Join(dir, "cdi", "test.hwdra.io_claim_u3.json")); !strings.HasPrefix(a, `{"version":"hwdra.io/claim/v4","checksum":"sha256:`) {
				t.Fatalf("annotation written: %s", a)
			}
		})
	}
}

func annotation(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := yaml.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	return spec.Annotations[ClaimAnnotation]
}

// TestNewerSpecIsKept: with the checkpoint lost, a claim spec whose entry
// a newer agent wrote is neither read nor removed.
func TestNewerSpecIsKept(t *testing.T) {
	dir := t.TempDir()
	l := &ledger{held: map[string]bool{}}
	p := newPlugin(t, l, dir, "boot-1")
	prepareOK(t, p, "u1")
	spec := filepath.Join(dir, "cdi", "test.hwdra.io_claim_u1.json")
	raw, _ := os.ReadFile(spec)
	newer := strings.Replace(string(raw), `hwdra.io/claim/v4`, `hwdra.io/claim/v5`, 1)
	if newer == string(raw) {
		t.Fatal("no version in the spec")
	}
	os.WriteFile(spec, []byte(newer), 0o644)
	os.RemoveAll(filepath.Join(dir, "state"))
	p = newPlugin(t, l, dir, "boot-1")
	if got := p.Prepared(); len(got) != 0 {
		t.Fatalf("read a newer agent's claim: %v", got)
	}
	if now, err := os.ReadFile(spec); err != nil || string(now) != newer {
		t.Fatalf("the newer spec changed: %v", err)
	}
}

// blockingWriter holds checkpoint writes until released, as a disk would
// that takes its time to flush.
type blockingWriter struct {
	once    sync.Once
	writing chan struct{} // closed when the first write starts
	release chan struct{}
	next    writer
}

func (w *blockingWriter) Write(data []byte, durable bool) error {
	w.once.Do(func() { close(w.writing) })
	<-w.release
	return w.next.Write(data, durable)
}

// TestReadersDoNotWaitForACheckpointWrite: while a prepare's checkpoint
// write is on its way to the disk, the readers the NRI hooks use return
// at once, with the claims as last written.
func TestReadersDoNotWaitForACheckpointWrite(t *testing.T) {
	dir := t.TempDir()
	p := newPlugin(t, &ledger{held: map[string]bool{}}, dir, "boot-1")
	prepareOK(t, p, "u1")
	w := &blockingWriter{writing: make(chan struct{}), release: make(chan struct{}), next: p.file}
	p.file = w
	prepared := make(chan map[types.UID]kubeletplugin.PrepareResult, 1)
	go func() {
		res, _ := p.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{testClaim("u2")})
		prepared <- res
	}()
	<-w.writing // u2's first intent

	type seen struct {
		prepared []types.UID
		claims   []types.UID
		devices  int
	}
	read := make(chan seen, 1)
	go func() {
		read <- seen{p.Prepared(), slices.Sorted(maps.Keys(p.Claims())), len(p.Devices("u1"))}
	}()
	select {
	case got := <-read:
		if want := (seen{[]types.UID{"u1"}, []types.UID{"u1"}, 1}); !reflect.DeepEqual(got, want) {
			t.Errorf("read during the write: %+v, want %+v", got, want)
		}
	case <-time.After(30 * time.Second): // a guard against hanging, not a threshold
		t.Error("a reader waited for the checkpoint write")
	}
	close(w.release)
	if res := <-prepared; res["u2"].Err != nil {
		t.Fatal(res["u2"].Err)
	}
	if got := p.Prepared(); !slices.Equal(got, []types.UID{"u1", "u2"}) {
		t.Fatalf("prepared after the write: %v", got)
	}
}
