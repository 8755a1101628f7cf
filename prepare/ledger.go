package prepare

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/slotfile"
)

// Ledger is a small persistent map, written atomically on every change,
// for hardware state a driver creates outside any one claim's record: the
// GPU instances it made, the VFs whose settings it changed. Start-up
// reconciliation compares it with the claims' records, so state made by
// this agent is reclaimed while state made by an administrator (a static
// MIG partition) is never touched.
type Ledger[V any] struct {
	path string
	file *slotfile.Writer
	mu   sync.Mutex
	m    map[string]V
	// version counts changes, so a reader can tell whether the ledger
	// changed while it looked at the hardware.
	version uint64
}

type ledgerFile[V any] struct {
	Version string       `json:"version"`
	Entries map[string]V `json:"entries"`
}

const ledgerVersion = "hwdra.io/ledger/v1"

// OpenLedger reads a ledger; a missing file is empty. An unreadable file
// is set aside and reported, and the ledger starts empty. A newer agent's
// ledger (a downgrade) is left as it is and this agent keeps its own
// beside it.
func OpenLedger[V any](path string) (*Ledger[V], error) {
	f, err := readLedger[V](path)
	if errors.Is(err, ErrNewer) {
		own := ownPath(path, ledgerVersion)
		klog.ErrorS(err, "Ledger of a newer agent left as it is; this agent keeps its own beside it", "file", own)
		path = own
		f, err = readLedger[V](path)
	}
	if errors.Is(err, ErrCorrupt) {
		dest, mvErr := setAside(path, time.Now())
		klog.ErrorS(err, "Ledger unusable: set aside; state it listed is no longer reclaimed automatically", "movedTo", dest)
		if mvErr != nil {
			return nil, mvErr
		}
		f, err = ledgerFile[V]{}, nil
	}
	if err != nil {
		return nil, err
	}
	l := &Ledger[V]{path: path, m: f.Entries, file: slotfile.NewWriter(path)}
	if l.m == nil {
		l.m = map[string]V{}
	}
	return l, nil
}

func readLedger[V any](path string) (ledgerFile[V], error) {
	var f ledgerFile[V]
	raw, err := slotfile.Read(path)
	switch {
	case errors.Is(err, slotfile.ErrCorrupt):
		return f, fmt.Errorf("%w: ledger %w", ErrCorrupt, err)
	case err != nil || raw == nil:
		return f, err
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return f, fmt.Errorf("%w: ledger %s: %v", ErrCorrupt, path, err)
	}
	if newer(f.Version, ledgerVersion) {
		return f, fmt.Errorf("%w: ledger %s: version %q, this agent reads %q", ErrNewer, path, f.Version, ledgerVersion)
	}
	if f.Version != ledgerVersion {
		return f, fmt.Errorf("%w: ledger %s: version %q, this agent reads %q", ErrCorrupt, path, f.Version, ledgerVersion)
	}
	return f, nil
}

// Put records an entry (before the state it describes is created).
func (l *Ledger[V]) Put(key string, v V) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[key] = v
	l.version++
	return l.write()
}

// Delete forgets an entry (after the state it describes is gone).
func (l *Ledger[V]) Delete(key string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[key]; !ok {
		return nil
	}
	delete(l.m, key)
	l.version++
	return l.write()
}

// Get returns one entry.
func (l *Ledger[V]) Get(key string) (V, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.m[key]
	return v, ok
}

// Keys lists the entries' keys, sorted.
func (l *Ledger[V]) Keys() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := make([]string, 0, len(l.m))
	for k := range l.m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Version counts the ledger's changes since it was opened.
func (l *Ledger[V]) Version() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.version
}

// Snapshot returns a copy of every entry and the version it is of.
func (l *Ledger[V]) Snapshot() (map[string]V, uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.m), l.version
}

func (l *Ledger[V]) write() error {
	raw, err := json.Marshal(ledgerFile[V]{Version: ledgerVersion, Entries: l.m})
	if err != nil {
		return err
	}
	// Not flushed to the disk: what it lists does not outlive a power loss
	// anyway (the node boots again, and GPU instances and VF settings go
	// with it), and a process crash keeps the page cache.
	if err := l.file.Write(raw, false); err != nil {
		return fmt.Errorf("ledger %s: %w", l.path, err)
	}
	return nil
}
