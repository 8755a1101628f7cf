// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/state"
)

// Leftover is a VF whose settings the agent changed and has not put back:
// its ledger entry outlives an unprepare whose restore failed (or that
// never ran), and holds what the VF had before.
type Leftover struct {
	// PCIAddress is the VF's.
	PCIAddress string
	// PF is the PF's netdev name, Index the VF's number on it.
	PF    string
	Index int
	// Original is the VF's configuration before the agent changed it.
	Original hw.VFConfig
}

// Leftovers reads the ledger in stateDir: after every claim was
// unprepared, each entry is a VF whose settings could not be restored
// (Unprepare keeps the entry when SetVF fails). The lab reports them
// instead of calling a run clean. Sorted by VF address.
func Leftovers(stateDir string) ([]Leftover, error) {
	data, err := state.Read(filepath.Join(stateDir, LedgerFile), state.LedgerFormat)
	if err != nil || data == nil {
		return nil, err
	}
	var entries map[string]LedgerEntry
	if err := json.Unmarshal(data, &entries); err != nil {
		return nil, fmt.Errorf("%s: %w", LedgerFile, err)
	}
	out := make([]Leftover, 0, len(entries))
	for addr, e := range entries {
		out = append(out, Leftover{PCIAddress: addr, PF: e.PF, Index: e.Index, Original: e.Original})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PCIAddress < out[j].PCIAddress })
	return out, nil
}
