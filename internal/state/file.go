// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package state

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// File is a state file of one format, in two slots written in place.
// Its methods are safe for concurrent use.
type File struct {
	path   string
	format Format
	mu     sync.Mutex
	slots  *slots
	env    []byte // reused
}

// Open opens the state file of format f at path, for this agent to
// write, and hands its data, in the current version, to decode. found is
// false when there was nothing to read. No unusable file stops the agent:
//   - of an older version: migrated (written in the current one at the
//     next Write);
//   - of a newer version (a downgrade): never moved nor written; this
//     agent keeps its own file beside it, named by its version;
//   - unreadable, of another kind, or refused by decode: set aside
//     (renamed, ".corrupt-<time>"), logged with lost, what that costs, and
//     the agent starts without it.
func Open(ctx context.Context, path string, f Format, decode func(data []byte) error, lost string) (file *File, found bool, err error) {
	logger := klog.FromContext(ctx)
	data, from, err := read(path, f)
	if errors.Is(err, ErrNewer) {
		own := besidePath(path, f.Version)
		logger.Error(err, "State file of a newer agent left as it is; this agent keeps its own beside it", "file", own)
		path = own
		data, from, err = read(path, f)
	}
	if err == nil && data != nil {
		if derr := decode(data); derr != nil {
			err = fmt.Errorf("%w: %s: %v", ErrCorrupt, path, derr)
		}
	}
	if errors.Is(err, ErrCorrupt) {
		moved, mvErr := setAside(path, asideSuffix("corrupt"))
		logger.Error(err, "State file unusable: set aside; "+lost, "file", path, "movedTo", strings.Join(moved, ", "))
		if mvErr != nil {
			return nil, false, errors.Join(err, mvErr)
		}
		data, err = nil, nil
	}
	if err != nil {
		return nil, false, err
	}
	if data != nil && from != f.Version {
		logger.Info("State file of an older version migrated", "file", path, "from", from, "to", f.Version)
	}
	return &File{path: path, format: f, slots: newSlots(path)}, data != nil, nil
}

// besidePath is where an agent that writes version v keeps its file when
// path holds a newer agent's ("x.json" -> "x.v1.json").
func besidePath(path string, v int) string {
	return strings.TrimSuffix(path, ".json") + ".v" + strconv.Itoa(v) + ".json"
}

// asideSuffix names a file set aside now, and why ("corrupt", "merged").
func asideSuffix(why string) string {
	return "." + why + "-" + time.Now().UTC().Format("20060102T150405Z")
}

// read returns the data of the file at path in f's current version and
// the version it was stored in; nil when there is no file.
func read(path string, f Format) ([]byte, int, error) {
	doc, _, _, err := scan(path)
	if err != nil || doc == nil {
		return nil, 0, err
	}
	data, from, err := f.Decode(doc)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	return data, from, nil
}

// Read returns the data of the state file of format f at path in the
// current version, as Open would see it; nil when there is no file. For
// tests and tools that look at an agent's state.
func Read(path string, f Format) ([]byte, error) {
	data, _, err := read(path, f)
	return data, err
}

// Path is where the file is (beside the usual path for a downgraded agent).
func (f *File) Path() string { return f.path }

// Write replaces the file's data, compact JSON in the current version.
// With durable it is on the disk (fdatasync) when Write returns.
func (f *File) Write(data []byte, durable bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.env = f.format.appendEnvelope(f.env[:0], data)
	if err := f.slots.write(f.env, durable); err != nil {
		return fmt.Errorf("%s: %w", f.format.Kind, err)
	}
	return nil
}

// Close closes the slot files.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.slots.close()
}
