// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hwdra/hwdra/internal/state"
)

// Leftovers reads the ledger in stateDir and says, one line per entry,
// what the agent changed on the hardware and has not undone: after every
// claim was unprepared, each line is a setting it could not restore (the
// restores are best effort and log their failures, ledger.go), named with
// its GPU and what it was. The lab reports them instead of calling a run
// clean.
func Leftovers(stateDir string) ([]string, error) {
	data, err := state.Read(filepath.Join(stateDir, DriverName+".ledger.json"), state.LedgerFormat)
	if err != nil || data == nil {
		return nil, err
	}
	var entries map[string]ledgerEntry
	if err := json.Unmarshal(data, &entries); err != nil {
		return nil, fmt.Errorf("%s ledger: %w", DriverName, err)
	}
	var out []string
	for key, e := range entries {
		out = append(out, "GPU "+e.GPU+": "+e.describe(key))
	}
	sort.Strings(out)
	return out, nil
}

// describe says what a ledger entry stands for, as left on the GPU.
func (e ledgerEntry) describe(key string) string {
	switch {
	case e.MIGEnabled != nil:
		return "MIG mode not restored (was " + onOff(*e.MIGEnabled) + ")"
	case isSettingsKey(key):
		var was []string
		if e.ComputeMode != "" {
			was = append(was, "compute mode "+string(e.ComputeMode))
		}
		if e.TimeSlice != nil {
			was = append(was, fmt.Sprintf("time slice %d", *e.TimeSlice))
		}
		return "settings not restored (was " + strings.Join(was, ", ") + ")"
	case e.VF != "":
		return fmt.Sprintf("VF %s still a vGPU of type %d", e.VF, e.VFType)
	case e.Mdev != "":
		return "mediated device " + e.Mdev + " not removed"
	case e.Placement != nil:
		return fmt.Sprintf("GPU instance of profile %d at slice %d not destroyed", e.Profile, e.Placement.Start)
	}
	return key
}
