// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// The state files live on the node's disk, and a crash, a full disk, a
// bad sector or a hand's edit can leave anything in them. Whatever is
// there, the agent starts (no crash loop on corrupt state): the fuzz
// tests hold Format.Decode and Open to that, and to their round trips.

var formats = []Format{CheckpointFormat, LedgerFormat, ClaimFormat}

// seedStates are the files released agents wrote (testdata here and in
// prepare) and an envelope of each format.
func seedStates(tb testing.TB) [][]byte {
	tb.Helper()
	var out [][]byte
	for _, glob := range []string{"testdata/*/*", "../agent/prepare/testdata/*/*"} {
		files, err := filepath.Glob(glob)
		if err != nil {
			tb.Fatal(err)
		}
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				tb.Fatal(err)
			}
			out = append(out, bytes.TrimSpace(data))
			if doc, _, err := parseSlot(data, 0); err == nil {
				out = append(out, doc) // the envelope inside the slot
			}
		}
	}
	for _, f := range formats {
		out = append(out, f.Encode([]byte(`{"a":{"claim":"c1","n":1}}`)))
	}
	return out
}

// FuzzFormatDecode: every refusal is ErrCorrupt or ErrNewer (what Open
// sets aside or leaves alone); what is read is JSON that, written again,
// reads the same in the current version.
func FuzzFormatDecode(f *testing.F) {
	for _, s := range seedStates(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		for _, format := range formats {
			data, from, err := format.Decode(doc)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNewer) {
					t.Fatalf("%s: %v is neither corrupt nor newer", format, err)
				}
				continue
			}
			if from < 1 || from > format.Version {
				t.Fatalf("%s: read as version %d", format, from)
			}
			if !json.Valid(data) {
				t.Fatalf("%s: read %q, no JSON", format, data)
			}
			again, v, err := format.Decode(format.Encode(data))
			if err != nil || v != format.Version || !bytes.Equal(again, bytes.TrimSpace(data)) {
				t.Fatalf("%s: %q written and read again: %q, version %d, %v", format, data, again, v, err)
			}
		}
	})
}

// FuzzOpenAnyFile: a state file's two slots hold anything; the agent's
// ledger opens all the same (what it cannot use set aside), takes a
// write and reads it back after a restart.
func FuzzOpenAnyFile(f *testing.F) {
	for _, s := range seedStates(f) {
		f.Add(s, []byte(nil))
		f.Add([]byte(nil), s)
	}
	slotted := newSlotsDoc(7, LedgerFormat.Encode([]byte(`{"k":1}`)))
	f.Add(slotted, slotted[:len(slotted)/2])
	f.Fuzz(func(t *testing.T, slot0, slot1 []byte) {
		path := filepath.Join(t.TempDir(), "test.ledger.json")
		for i, content := range [][]byte{slot0, slot1} {
			if content != nil {
				if err := os.WriteFile(slotPaths(path)[i], content, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		l, err := OpenLedger[json.RawMessage](path)
		if err != nil {
			t.Fatalf("the ledger does not open: %v", err)
		}
		if err := l.Put("written", json.RawMessage(`2`)); err != nil {
			t.Fatalf("write after open: %v", err)
		}
		if err := l.file.(*File).Close(); err != nil {
			t.Fatal(err)
		}
		again, err := OpenLedger[json.RawMessage](path)
		if err != nil {
			t.Fatalf("the ledger does not open again: %v", err)
		}
		defer again.file.(*File).Close()
		if v, ok := again.Get("written"); !ok || string(v) != "2" {
			t.Fatalf("the entry written after open reads %q, %v", v, ok)
		}
	})
}

// newSlotsDoc is a slot as the slot writer makes it.
func newSlotsDoc(seq uint64, doc []byte) []byte {
	s := slot{Sequence: &seq, Checksum: string(appendChecksum(nil, doc)), Data: doc}
	out, _ := json.Marshal(s)
	return out
}
