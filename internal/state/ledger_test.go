// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package state

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

func TestLedgerPersistsAndRecoversFromCorruption(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "l.json")
	l, err := OpenLedger[int](path)
	if err != nil {
		t.Fatal(err)
	}
	l.Put("b", 2)
	l.Put("a", 1)
	l.Delete("b")
	l2, _ := OpenLedger[int](path)
	if keys := l2.Keys(); len(keys) != 1 || keys[0] != "a" {
		t.Fatalf("reopened ledger has %v", keys)
	}
	Replace(path, []byte("{garbage"))
	l3, err := OpenLedger[int](path)
	if err != nil || len(l3.Keys()) != 0 {
		t.Fatalf("corrupt ledger: %v %v", l3.Keys(), err)
	}
	if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) != 1 {
		t.Fatal("corrupt ledger not set aside")
	}
}

func TestNewerLedgerIsLeftAlone(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "l.json")
	newer := []byte(`{"version":"hwdra.io/ledger/v3","checksum":"sha256:x","data":{"x":1}}`)
	if err := Replace(path, newer); err != nil {
		t.Fatal(err)
	}
	l, err := OpenLedger[int](path)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Keys()) != 0 {
		t.Fatalf("read the newer ledger's entries: %v", l.Keys())
	}
	l.Put("a", 1)
	if raw, _ := os.ReadFile(path); string(raw) != string(newer) {
		t.Fatalf("the newer ledger changed: %s", raw)
	}
	if again, _ := OpenLedger[int](path); len(again.Keys()) != 1 || again.Keys()[0] != "a" {
		t.Fatalf("this agent's own ledger after a reopen: %v", again.Keys())
	}
}

// blockingWriter holds every write until released, as a disk would that
// takes its time to flush.
type blockingWriter struct {
	writing chan struct{} // a write has started
	release chan struct{}
	next    writer
}

func (w *blockingWriter) Write(data []byte, durable bool) error {
	w.writing <- struct{}{}
	<-w.release
	return w.next.Write(data, durable)
}

// TestLedgerReadersDoNotWaitForAWrite: while a change is being written,
// readers return at once with the entries as they were before it.
func TestLedgerReadersDoNotWaitForAWrite(t *testing.T) {
	t.Parallel()
	l, err := OpenLedger[int](filepath.Join(t.TempDir(), "l.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Put("a", 1); err != nil {
		t.Fatal(err)
	}
	w := &blockingWriter{writing: make(chan struct{}), release: make(chan struct{}), next: l.file}
	l.file = w
	put := make(chan error, 1)
	go func() { put <- l.Put("b", 2) }()
	<-w.writing

	read := make(chan []any, 1)
	go func() {
		v, ok := l.Get("a")
		snap, version := l.Snapshot()
		read <- []any{v, ok, l.Keys(), snap, version, l.Version()}
	}()
	select {
	case got := <-read:
		want := []any{1, true, []string{"a"}, map[string]int{"a": 1}, uint64(1), uint64(1)}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("read during the write: %v, want %v", got, want)
		}
	case <-time.After(30 * time.Second): // a guard against hanging, not a threshold
		close(w.release)
		t.Fatal("a reader waited for the write")
	}
	close(w.release)
	if err := <-put; err != nil {
		t.Fatal(err)
	}
	if keys := l.Keys(); !reflect.DeepEqual(keys, []string{"a", "b"}) || l.Version() != 2 {
		t.Fatalf("after the write: %v, version %d", keys, l.Version())
	}
}

// TestFailedLedgerWriteChangesNothing: what readers see is what is on disk.
func TestFailedLedgerWriteChangesNothing(t *testing.T) {
	t.Parallel()
	l, err := OpenLedger[int](filepath.Join(t.TempDir(), "l.json"))
	if err != nil {
		t.Fatal(err)
	}
	l.file = failingWriter{}
	if err := l.Put("a", 1); err == nil {
		t.Fatal("Put reported no error")
	}
	if _, ok := l.Get("a"); ok || l.Version() != 0 {
		t.Fatalf("a failed Put is visible: version %d", l.Version())
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte, bool) error { return errors.New("disk full") }
