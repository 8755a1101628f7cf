// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package state

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"
)

// Ledger is a small persistent map, written whole on every change, for
// hardware state a driver creates outside any one claim's record: the GPU
// instances it made, the VFs whose settings it changed, the VFs it placed
// in pods. Start-up reconciliation compares it with the claims' records,
// so state made by this agent is reclaimed while state made by an
// administrator (a static MIG partition) is never touched.
//
// Readers see the last written entries and never wait for a write: the
// NRI plugin reads its placements in the runtime's hooks, which the
// runtime drops after 2 s.
type Ledger[V any] struct {
	// mu serialises changes; each builds the next entries, writes them
	// and only then publishes them to readers.
	mu   sync.Mutex
	file writer
	cur  atomic.Pointer[ledgerState[V]]
	path string
}

// writer is where changes go: a File, or in tests one that blocks.
type writer interface {
	Write(data []byte, durable bool) error
}

// ledgerState is one version of the entries, never changed once published.
type ledgerState[V any] struct {
	m map[string]V
	// version counts changes, so a reader can tell whether the ledger
	// changed while it looked at the hardware.
	version uint64
}

// OpenLedger reads a ledger (LedgerFormat); a missing file is empty. An
// unreadable file is set aside and reported, and the ledger starts empty.
// A newer agent's ledger (a downgrade) is left as it is and this agent
// keeps its own beside it.
//
// An older agent's own ledger beside this one is merged in, its entries
// winning, and then set aside (".merged-<time>"): that agent ran after a
// downgrade, so after this file was last written, and it recorded what it
// made and took over in its own file. Without the merge an upgrade after a
// downgrade would work from entries older than the hardware.
func OpenLedger[V any](path string) (*Ledger[V], error) {
	ctx := context.Background()
	const lost = "state it listed is no longer reclaimed automatically"
	m, f, _, err := openEntries[V](ctx, path, lost)
	if err != nil {
		return nil, err
	}
	l := &Ledger[V]{file: f, path: f.Path()}
	l.cur.Store(&ledgerState[V]{m: m})
	for v := 1; v < LedgerFormat.Version; v++ {
		older := besidePath(path, v)
		om, of, found, err := openEntries[V](ctx, older, lost)
		if err != nil {
			return nil, err
		}
		of.Close()
		if !found {
			continue
		}
		merged := maps.Clone(m)
		maps.Copy(merged, om)
		if err := l.commit(merged); err != nil {
			return nil, err
		}
		m = merged
		moved, err := setAside(older, asideSuffix("merged"))
		klog.FromContext(ctx).Info("Merged the ledger an older agent kept after a downgrade", "file", l.path, "entries", len(om), "movedTo", moved)
		if err != nil {
			return nil, err
		}
	}
	return l, nil
}

// openEntries opens a ledger file and reads its entries (none when it is
// missing or was set aside: not found).
func openEntries[V any](ctx context.Context, path, lost string) (map[string]V, *File, bool, error) {
	var m map[string]V
	f, found, err := Open(ctx, path, LedgerFormat, func(data []byte) error { return json.Unmarshal(data, &m) }, lost)
	if err != nil {
		return nil, nil, false, err
	}
	if !found || m == nil {
		m = map[string]V{} // nothing read, or a half-read file set aside
	}
	return m, f, found, nil
}

// Put records an entry (before the state it describes is created).
func (l *Ledger[V]) Put(key string, v V) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := maps.Clone(l.cur.Load().m)
	m[key] = v
	return l.commit(m)
}

// Delete forgets an entry (after the state it describes is gone).
func (l *Ledger[V]) Delete(key string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := l.cur.Load().m
	if _, ok := cur[key]; !ok {
		return nil
	}
	m := maps.Clone(cur)
	delete(m, key)
	return l.commit(m)
}

// commit writes the next entries and publishes them. Not flushed to the
// disk: what a ledger lists does not outlive a power loss anyway (the node
// boots again, and GPU instances and VF settings go with it), and a
// process crash keeps the page cache. A failed write publishes nothing.
func (l *Ledger[V]) commit(m map[string]V) error {
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := l.file.Write(raw, false); err != nil {
		return err
	}
	l.cur.Store(&ledgerState[V]{m: m, version: l.cur.Load().version + 1})
	return nil
}

// Path is the file the ledger is kept in: beside the one opened when
// that is a newer agent's.
func (l *Ledger[V]) Path() string { return l.path }

// Get returns one entry.
func (l *Ledger[V]) Get(key string) (V, bool) {
	v, ok := l.cur.Load().m[key]
	return v, ok
}

// Keys lists the entries' keys, sorted.
func (l *Ledger[V]) Keys() []string {
	return slices.Sorted(maps.Keys(l.cur.Load().m))
}

// Version counts the ledger's changes since it was opened.
func (l *Ledger[V]) Version() uint64 { return l.cur.Load().version }

// Snapshot returns a copy of every entry and the version it is of.
func (l *Ledger[V]) Snapshot() (map[string]V, uint64) {
	s := l.cur.Load()
	return maps.Clone(s.m), s.version
}
