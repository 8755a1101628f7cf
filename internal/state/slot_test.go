// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package state

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, w *slots, data string) {
	t.Helper()
	if err := w.write([]byte(data), true); err != nil {
		t.Fatal(err)
	}
}

// read is the newest valid slot's document.
func readSlot(t *testing.T, path string) string {
	t.Helper()
	doc, _, _, err := scan(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(doc)
}

func TestNewestWriteWins(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state.json")
	if doc, _, _, err := scan(path); doc != nil || err != nil {
		t.Fatalf("missing file: %q %v", doc, err)
	}
	w := newSlots(path)
	long := `{"a":"` + strings.Repeat("x", 9000) + `"}`
	for _, d := range []string{`{"n":1}`, long, `{"n":3}`, `{"n":4}`} {
		write(t, w, d)
		if got := readSlot(t, path); got != d {
			t.Fatalf("read %.40q, want %.40q", got, d)
		}
	}
	w.close()
	// A new writer (an agent restart) continues after the newest and
	// never writes over it.
	w = newSlots(path)
	write(t, w, `{"n":5}`)
	corrupt(t, slotPaths(path)[1-w.next]) // damage the slot just written
	if got := readSlot(t, path); got != `{"n":4}` {
		t.Fatalf("after a torn write: %q, want the previous content", got)
	}
}

// corrupt simulates a write that stopped half-way.
func corrupt(t *testing.T, p string) {
	t.Helper()
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	copy(raw[len(`{"sequence":`)+5:], "GARBAGE")
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestTornWriteFallsBackToTheOtherSlot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, p string)
	}{
		{"garbage in the data", corrupt},
		{"only the first bytes written", func(t *testing.T, p string) {
			raw, _ := os.ReadFile(p)
			os.WriteFile(p, raw[:20], 0o600)
		}},
		{"empty", func(t *testing.T, p string) { os.WriteFile(p, nil, 0o600) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "state.json")
			w := newSlots(path)
			write(t, w, `{"n":1}`)
			write(t, w, `{"n":2}`) // slot 1
			tc.damage(t, slotPaths(path)[1])
			if got := readSlot(t, path); got != `{"n":1}` {
				t.Fatalf("got %q", got)
			}
			// The next write goes to the damaged slot, not over n:1.
			w2 := newSlots(path)
			write(t, w2, `{"n":3}`)
			if raw, _ := os.ReadFile(slotPaths(path)[0]); !strings.Contains(string(raw), `{"n":1}`) {
				t.Fatalf("the valid slot was overwritten: %q", raw)
			}
			if got := readSlot(t, path); got != `{"n":3}` {
				t.Fatalf("got %q", got)
			}
		})
	}
}

func TestNoValidSlot(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state.json")
	os.WriteFile(path, []byte("{garbage"), 0o600)
	if _, _, _, err := scan(path); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("scan: %v, want ErrCorrupt", err)
	}
	moved, err := setAside(path, ".corrupt")
	if err != nil || len(moved) != 1 || moved[0] != path+".corrupt" {
		t.Fatalf("setAside: %v %v", moved, err)
	}
	if doc, _, _, err := scan(path); doc != nil || err != nil {
		t.Fatalf("after setAside: %q %v", doc, err)
	}
}

func TestReadsAFileWrittenBeforeSlots(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "state.json")
	legacy := `{"version":"v1","entries":{"a":1}}`
	os.WriteFile(path, []byte(legacy+"\n"), 0o600)
	if got := readSlot(t, path); got != legacy {
		t.Fatalf("got %q", got)
	}
	w := newSlots(path)
	write(t, w, `{"n":1}`)
	if raw, _ := os.ReadFile(path); strings.TrimSpace(string(raw)) != legacy {
		t.Fatal("the first write went over the only valid content")
	}
	if got := readSlot(t, path); got != `{"n":1}` {
		t.Fatalf("got %q", got)
	}
}

// BenchmarkWrite is a state file write as prepare makes it (envelope and
// slot).
func BenchmarkWrite(b *testing.B) {
	data := []byte(`{"claims":{"` + strings.Repeat("x", 1500) + `":{}}}`)
	for _, durable := range []bool{true, false} {
		name := "durable"
		if !durable {
			name = "page-cache"
		}
		b.Run(name, func(b *testing.B) {
			w := &File{format: CheckpointFormat, slots: newSlots(filepath.Join(b.TempDir(), "state.json"))}
			defer w.Close()
			for b.Loop() {
				if err := w.Write(data, durable); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
