// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package state keeps the agent's persisted state: each format (the
// checkpoint, the ledgers, a claim's entry in its CDI spec) in one
// versioned envelope, older versions migrated forward, newer ones left for
// the agent that wrote them; state files in two slots written in place, a
// corrupt one set aside; and Ledger, a persistent map whose readers never
// wait for a write.
package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrCorrupt marks state that cannot be trusted: unreadable, of another
// kind, or of an older version this agent no longer migrates.
var ErrCorrupt = errors.New("corrupt")

// ErrNewer marks state written by a newer agent (a downgrade): left as it
// is, for that agent to find again.
var ErrNewer = errors.New("written by a newer hwdra")

// Format is one persisted format. Its envelope is
//
//	{"version":"<kind>/v<n>","checksum":"sha256:<hex>","data":…}
//
// with the checksum over data. The version is one string, the kind and
// the number, because that is what every released agent compares: one
// finding a later number of its kind leaves the state alone (ErrNewer).
// Any change to what data holds is a new version with an upgrade from the
// one before.
type Format struct {
	// Kind names what the state is ("hwdra.io/ledger").
	Kind string
	// Version is the version this agent writes.
	Version int
	// Unversioned is the version of a document with no version at all
	// (from before it had one); 0: such a document is corrupt.
	Unversioned int
	// Upgrades turn what version v stored into version v+1's data, for
	// every older version this agent reads. Before the envelope, what a
	// version stored is its whole document; since, the envelope's data.
	Upgrades map[int]func(stored []byte) ([]byte, error)
}

// String is the version this agent writes, as the envelope holds it.
func (f Format) String() string { return f.Kind + "/v" + strconv.Itoa(f.Version) }

// Decode reads a document of the format and returns its data in the
// current version, and the version it was stored in.
func (f Format) Decode(doc []byte) (data []byte, from int, err error) {
	var env struct {
		Version  *string         `json:"version"`
		Checksum string          `json:"checksum"`
		Data     json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(doc, &env); err != nil {
		return nil, 0, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	v := f.Unversioned
	switch {
	case env.Version == nil && v == 0:
		return nil, 0, fmt.Errorf("%w: no version, this agent reads %s", ErrCorrupt, f)
	case env.Version != nil:
		kind, num, ok := parseVersion(*env.Version)
		if !ok || kind != f.Kind {
			return nil, 0, fmt.Errorf("%w: version %q, this agent reads %s", ErrCorrupt, *env.Version, f)
		}
		if num > f.Version {
			return nil, 0, fmt.Errorf("%w: version %q, this agent reads %s", ErrNewer, *env.Version, f)
		}
		v = num
	}
	from, data = v, doc
	switch {
	case env.Data != nil:
		if sum := appendChecksum(nil, env.Data); string(sum) != env.Checksum {
			return nil, 0, fmt.Errorf("%w: checksum %s, content hashes to %s", ErrCorrupt, env.Checksum, sum)
		}
		data = env.Data
	case v == f.Version:
		return nil, 0, fmt.Errorf("%w: %s without data", ErrCorrupt, f)
	}
	for ; v < f.Version; v++ {
		up := f.Upgrades[v]
		if up == nil {
			return nil, 0, fmt.Errorf("%w: version %d of %s is no longer read (this agent reads %s)", ErrCorrupt, v, f.Kind, f)
		}
		if data, err = up(data); err != nil {
			return nil, 0, fmt.Errorf("%w: migrating %s from version %d: %v", ErrCorrupt, f.Kind, v, err)
		}
	}
	return data, from, nil
}

// parseVersion splits "<kind>/v<n>", n at least 1.
func parseVersion(v string) (kind string, n int, ok bool) {
	i := strings.LastIndex(v, "/v")
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(v[i+2:])
	return v[:i], n, err == nil && n >= 1
}

// Encode wraps data, compact JSON in the current version, in the envelope.
func (f Format) Encode(data []byte) []byte { return f.appendEnvelope(nil, data) }

func (f Format) appendEnvelope(dst, data []byte) []byte {
	data = bytes.TrimSpace(data) // as the reader's json.RawMessage will hold it
	dst = append(dst, `{"version":"`...)
	dst = append(dst, f.Kind...)
	dst = append(dst, "/v"...)
	dst = strconv.AppendInt(dst, int64(f.Version), 10)
	dst = append(dst, `","checksum":"`...)
	dst = appendChecksum(dst, data)
	dst = append(dst, `","data":`...)
	dst = append(dst, data...)
	return append(dst, '}')
}

// appendChecksum appends "sha256:" and data's hash in hex.
func appendChecksum(dst, data []byte) []byte {
	sum := sha256.Sum256(data)
	return hex.AppendEncode(append(dst, "sha256:"...), sum[:])
}
