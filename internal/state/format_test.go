// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package state

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	t.Parallel()
	ledgerV2 := string(LedgerFormat.Encode([]byte(`{"a":1}`)))
	claimV4 := string(ClaimFormat.Encode([]byte(`{"bootID":"b","claim":{}}`)))
	claimV3 := strings.Replace(claimV4, "/v4", "/v3", 1)
	claimV2 := strings.Replace(claimV4, "/v4", "/v2", 1)
	checkpointV3 := string(CheckpointFormat.Encode([]byte(`{"claims":{}}`)))
	checkpointV2 := strings.Replace(checkpointV3, "/v3", "/v2", 1)
	checkpointV1 := strings.Replace(checkpointV3, "/v3", "/v1", 1)
	// chain: v1 had no envelope, v2 and v3 have it.
	chain := Format{Kind: "test/chain", Version: 3, Upgrades: map[int]func([]byte) ([]byte, error){
		1: func(doc []byte) ([]byte, error) {
			return bytes.Replace(doc, []byte(`"version":"test/chain/v1",`), nil, 1), nil
		},
		2: func(data []byte) ([]byte, error) { return []byte(`{"from2":` + string(data) + `}`), nil },
	}}
	chainV2 := strings.Replace(string(chain.Encode([]byte(`{"n":2}`))), "/v3", "/v2", 1)
	for _, tc := range []struct {
		name   string
		format Format
		doc    string
		data   string
		from   int
		err    error
	}{
		{"current", LedgerFormat, ledgerV2, `{"a":1}`, 2, nil},
		{"ledger v1 (main)", LedgerFormat, `{"version":"hwdra.io/ledger/v1","entries":{"a":1}}`, `{"a":1}`, 1, nil},
		{"claim v4", ClaimFormat, claimV4, `{"bootID":"b","claim":{}}`, 4, nil},
		{"claim v3 (before shares' records)", ClaimFormat, claimV3, `{"bootID":"b","claim":{}}`, 3, nil},
		{"claim v2 (before sharing)", ClaimFormat, claimV2, `{"bootID":"b","claim":{}}`, 2, nil},
		{"checkpoint v3", CheckpointFormat, checkpointV3, `{"claims":{}}`, 3, nil},
		{"checkpoint v2 (before shares' records)", CheckpointFormat, checkpointV2, `{"claims":{}}`, 2, nil},
		{"checkpoint v1 (before sharing)", CheckpointFormat, checkpointV1, `{"claims":{}}`, 1, nil},
		{"claim v1, unversioned (main)", ClaimFormat, `{"bootID":"b","claim":{}}`, `{"bootID":"b","claim":{}}`, 1, nil},
		{"chain from v1", chain, `{"version":"test/chain/v1","n":1}`, `{"from2":{"n":1}}`, 1, nil},
		{"chain from v2", chain, chainV2, `{"from2":{"n":2}}`, 2, nil},
		{"newer", LedgerFormat, `{"version":"hwdra.io/ledger/v3","checksum":"x","data":{}}`, "", 0, ErrNewer},
		{"newer, of a layout unknown", LedgerFormat, `{"version":"hwdra.io/ledger/v9","whatever":[]}`, "", 0, ErrNewer},
		{"another kind", LedgerFormat, `{"version":"hwdra.io/checkpoint/v1","entries":{}}`, "", 0, ErrCorrupt},
		{"another kind's envelope", LedgerFormat, string(CheckpointFormat.Encode([]byte(`{}`))), "", 0, ErrCorrupt},
		{"bad checksum", LedgerFormat, strings.Replace(ledgerV2, `"a":1`, `"a":2`, 1), "", 0, ErrCorrupt},
		{"version 0", LedgerFormat, `{"version":"hwdra.io/ledger/v0","checksum":"x","data":{}}`, "", 0, ErrCorrupt},
		{"no version", LedgerFormat, `{"entries":{}}`, "", 0, ErrCorrupt},
		{"current version, no envelope", LedgerFormat, `{"version":"hwdra.io/ledger/v2","entries":{}}`, "", 0, ErrCorrupt},
		{"an older version no longer read", Format{Kind: "k", Version: 2}, `{"version":"k/v1"}`, "", 0, ErrCorrupt},
		{"a failed migration", LedgerFormat, `{"version":"hwdra.io/ledger/v1"}`, "", 0, ErrCorrupt},
		{"garbage", LedgerFormat, `{"version":`, "", 0, ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, from, err := tc.format.Decode([]byte(tc.doc))
			if !errors.Is(err, tc.err) || string(data) != tc.data || from != tc.from {
				t.Fatalf("Decode: %s, from %d, %v; want %s, from %d, %v", data, from, err, tc.data, tc.from, tc.err)
			}
		})
	}
}

// The fixtures in testdata/v1 are what main (766ef49) wrote: a ledger
// (Put "gone", "a", "b", Delete "gone") in its two slots.
type fixtureEntry struct {
	Claim string `json:"claim"`
	N     int    `json:"n"`
}

func copyFixture(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join("testdata", "v1", n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMainsLedgerIsMigrated: a ledger main wrote opens with its entries,
// and the next change writes it in the current version, which main would
// leave alone (its reader keeps files of a later version of its kind).
func TestMainsLedgerIsMigrated(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	copyFixture(t, dir, "ledger.json", "ledger.json.1")
	path := filepath.Join(dir, "ledger.json")
	l, err := OpenLedger[fixtureEntry](path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]fixtureEntry{"a": {"c1", 1}, "b": {"c2", 2}}
	if got, _ := l.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	if err := l.Put("c", fixtureEntry{"c3", 3}); err != nil {
		t.Fatal(err)
	}
	doc, _, _, err := scan(path)
	if err != nil {
		t.Fatal(err)
	}
	var env struct{ Version string }
	if err := json.Unmarshal(doc, &env); err != nil || env.Version != "hwdra.io/ledger/v2" {
		t.Fatalf("written as %q (%v), want hwdra.io/ledger/v2", env.Version, err)
	}
	again, err := OpenLedger[fixtureEntry](path)
	if err != nil {
		t.Fatal(err)
	}
	want["c"] = fixtureEntry{"c3", 3}
	if got, _ := again.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after a reopen: %v, want %v", got, want)
	}
}

func TestOpenSetsAsideWhatItCannotUse(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		content string
		decode  func([]byte) error
	}{
		"garbage":        {"{garbage", nil},
		"another kind":   {string(CheckpointFormat.Encode([]byte(`{}`))), nil},
		"bad checksum":   {`{"version":"hwdra.io/ledger/v2","checksum":"sha256:00","data":{}}`, nil},
		"decode refuses": {string(LedgerFormat.Encode([]byte(`{}`))), func([]byte) error { return errors.New("unknown field") }},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.json")
			Replace(path, []byte(tc.content))
			decode := tc.decode
			if decode == nil {
				decode = func([]byte) error { return nil }
			}
			f, found, err := Open(context.Background(), path, LedgerFormat, decode, "nothing lost")
			if err != nil || found {
				t.Fatalf("Open: found %v, %v", found, err)
			}
			if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) != 1 {
				t.Fatalf("set aside: %v", m)
			}
			if err := f.Write([]byte(`{"a":1}`), true); err != nil {
				t.Fatal(err)
			}
			if data, err := Read(path, LedgerFormat); err != nil || string(data) != `{"a":1}` {
				t.Fatalf("after a write: %s %v", data, err)
			}
		})
	}
}

// TestUpgradeAfterDowngradeMergesTheOlderLedger: main, run after a
// downgrade, kept its own ledger beside this agent's (x.v1.json); this
// agent, back, merges it in (main's entries win) and sets it aside.
func TestUpgradeAfterDowngradeMergesTheOlderLedger(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "x.json")
	l, err := OpenLedger[fixtureEntry](path)
	if err != nil {
		t.Fatal(err)
	}
	l.Put("a", fixtureEntry{"before the downgrade", 0})
	l.Put("stale", fixtureEntry{"s", 9})
	l.file.(*File).Close()
	copyFixture(t, dir, "ledger.json", "ledger.json.1")
	os.Rename(filepath.Join(dir, "ledger.json"), filepath.Join(dir, "x.v1.json"))
	os.Rename(filepath.Join(dir, "ledger.json.1"), filepath.Join(dir, "x.v1.json.1"))

	want := map[string]fixtureEntry{"a": {"c1", 1}, "b": {"c2", 2}, "stale": {"s", 9}}
	for range 2 { // and again: merged once
		l, err := OpenLedger[fixtureEntry](path)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := l.Snapshot(); !reflect.DeepEqual(got, want) {
			t.Fatalf("entries %v, want %v", got, want)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "x.v1.json*")); len(m) != 2 || !strings.Contains(m[0], ".merged-") || !strings.Contains(m[1], ".merged-") {
		t.Fatalf("the older ledger not set aside: %v", m)
	}
}
