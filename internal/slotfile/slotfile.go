// Package slotfile keeps a small JSON state file (a checkpoint, a ledger)
// that is replaced whole and survives a crash at any point, at the cost of
// one write, plus one fdatasync where it must survive a power loss too.
//
// The usual temp file, fsync, rename and fsync of the folder costs a file
// creation, two flushes, and on ext4 a third: renaming over an existing
// file flushes the new file's data (auto_da_alloc) even unasked. Measured
// on this project's CI disk (ext4): 1.3-1.7 ms per write against 0.17 ms
// for a write in place and fdatasync, and on the path of every prepare.
//
// So the file has two slots, path and path+".1", written in place in turn.
// Each holds one JSON document, {"sequence":N,"checksum":"sha256:…",
// "data":…}, padded with spaces over any longer earlier content. A write
// goes to the slot that does not hold the newest valid document: a crash
// in the middle damages only that slot (its checksum or its JSON no longer
// holds), and the reader takes the other. Each slot stays a whole JSON
// document that an operator can read; the newer is the one with the
// higher sequence.
//
// A file written before slots existed (a plain JSON document at path) is
// read as sequence 0.
package slotfile

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrCorrupt: a slot file exists but none holds a valid document.
var ErrCorrupt = errors.New("no valid copy")

// Paths are the slot files of a file, in slot order.
func Paths(path string) [2]string { return [2]string{path, path + ".1"} }

type slot struct {
	Sequence *uint64         `json:"sequence"`
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// scan reads both slots: the newest valid document's data, its sequence
// and slot (-1 when none is valid), and whether any slot file exists.
func scan(path string) (data []byte, seq uint64, newest int, exists bool, err error) {
	newest = -1
	var problems []error
	for i, p := range Paths(path) {
		raw, rerr := os.ReadFile(p)
		if errors.Is(rerr, fs.ErrNotExist) {
			continue
		}
		exists = true
		if rerr != nil {
			return nil, 0, -1, true, rerr
		}
		d, s, perr := parse(raw, i)
		if perr != nil {
			problems = append(problems, fmt.Errorf("%s: %w", p, perr))
			continue
		}
		if newest < 0 || s > seq {
			data, seq, newest = d, s, i
		}
	}
	if exists && newest < 0 {
		return nil, 0, -1, true, fmt.Errorf("%w: %w", ErrCorrupt, errors.Join(problems...))
	}
	return data, seq, newest, exists, nil
}

func parse(raw []byte, slotIndex int) ([]byte, uint64, error) {
	var s slot
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, 0, err
	}
	if s.Sequence == nil {
		if slotIndex == 0 {
			return bytes.TrimSpace(raw), 0, nil // written before slots
		}
		return nil, 0, errors.New("no sequence")
	}
	if got := checksum(s.Data); got != s.Checksum {
		return nil, 0, fmt.Errorf("checksum %s, content hashes to %s", s.Checksum, got)
	}
	return s.Data, *s.Sequence, nil
}

// Read returns the newest valid data of the file; nil, nil when it does
// not exist. When slot files exist but none is valid the error wraps
// ErrCorrupt.
func Read(path string) ([]byte, error) {
	data, _, _, _, err := scan(path)
	return data, err
}

// Writer replaces the file's content. Its methods are safe for concurrent
// use.
type Writer struct {
	mu    sync.Mutex
	paths [2]string
	files [2]*os.File
	sizes [2]int
	seq   uint64
	next  int
}

// NewWriter prepares writes after the newest valid content of the file at
// path: they never overwrite it. A file without any valid slot is
// written afresh.
func NewWriter(path string) *Writer {
	w := &Writer{paths: Paths(path)}
	if _, seq, newest, _, err := scan(path); err == nil && newest >= 0 {
		w.seq, w.next = seq, 1-newest
	}
	return w
}

// Write replaces the content with data, a JSON document. With durable the
// slot is also flushed to the disk (fdatasync) before Write returns.
func (w *Writer) Write(data []byte, durable bool) error {
	data = bytes.TrimSpace(data) // as the reader's json.RawMessage will hold it
	w.mu.Lock()
	defer w.mu.Unlock()
	i := w.next
	f := w.files[i]
	if f == nil {
		var err error
		if f, err = os.OpenFile(w.paths[i], os.O_RDWR|os.O_CREATE, 0o600); err != nil {
			return err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return err
		}
		w.files[i], w.sizes[i] = f, int(st.Size())
	}
	seq := w.seq + 1
	doc := make([]byte, 0, len(data)+128)
	doc = append(doc, `{"sequence":`...)
	doc = strconv.AppendUint(doc, seq, 10)
	doc = append(doc, `,"checksum":"`...)
	doc = append(doc, checksum(data)...)
	doc = append(doc, `","data":`...)
	doc = append(doc, data...)
	doc = append(doc, "}\n"...)
	// Pad over the rest of earlier content, and in whole pages so that
	// the size, which fdatasync would have to flush too, rarely changes.
	size := max(w.sizes[i], (len(doc)+4095)/4096*4096)
	for len(doc) < size-1 {
		doc = append(doc, ' ')
	}
	doc = append(doc, '\n')
	if _, err := f.WriteAt(doc, 0); err != nil {
		return fmt.Errorf("write %s: %w", w.paths[i], err)
	}
	w.sizes[i] = size
	if durable {
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return fmt.Errorf("fdatasync %s: %w", w.paths[i], err)
		}
	}
	w.seq, w.next = seq, 1-i
	return nil
}

// Close closes the slot files.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var errs []error
	for i, f := range w.files {
		if f != nil {
			errs = append(errs, f.Close())
			w.files[i] = nil
		}
	}
	return errors.Join(errs...)
}

// SetAside renames the file's slot files, adding suffix, and returns where
// they went: an unusable file is kept for a human to inspect.
func SetAside(path, suffix string) ([]string, error) {
	var moved []string
	var errs []error
	for _, p := range Paths(path) {
		if err := os.Rename(p, p+suffix); err == nil {
			moved = append(moved, p+suffix)
		} else if !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return moved, errors.Join(errs...)
}

// Replace makes content the file's only copy, in its first slot, as an
// agent from before slots or a damaged disk leaves it: for tests and
// operators' repairs.
func Replace(path string, content []byte) error {
	if err := os.Remove(Paths(path)[1]); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.WriteFile(path, content, 0o600)
}

func checksum(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}
