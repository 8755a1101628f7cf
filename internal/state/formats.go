// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package state

import (
	"encoding/json"
	"fmt"
)

// The agent's persisted formats, each with the upgrades of the older
// versions it still reads. Version 1 of each is what agents up to
// 766ef49 wrote.
var (
	// CheckpointFormat is a driver's checkpoint ("<driver>.checkpoint.json"
	// in the state directory): the boot ID and the claims it prepared.
	// Version 1 was the envelope already; version 2 added the GPU
	// records' sharing (an agent of version 1 would not know the MPS
	// daemons and time slices it finds there, and refuses the field);
	// version 3 added sharing.share, a GPU share's limits and isolation
	// (an agent of version 2 would refuse the field, and would not know
	// a dedicated share's daemon). The GPU records' vf (VFIO-framework
	// vGPUs) came within version 1: read in any.
	CheckpointFormat = Format{Kind: "hwdra.io/checkpoint", Version: 3, Upgrades: map[int]func([]byte) ([]byte, error){
		1: same,
		2: same,
	}}

	// LedgerFormat is a Ledger's entries, data a JSON object by key: the
	// GPU instances and VFs a driver made ("<driver>.ledger.json") and
	// the VFs the NRI plugin placed in pods ("<driver>.netns.json").
	// Version 1 was {"version":"hwdra.io/ledger/v1","entries":{…}}, no
	// checksum of its own.
	LedgerFormat = Format{Kind: "hwdra.io/ledger", Version: 2, Upgrades: map[int]func([]byte) ([]byte, error){
		1: ledgerV1,
	}}

	// ClaimFormat is a prepared claim's checkpoint entry that its CDI spec
	// keeps (annotation "hwdra.io/claim"), data {"bootID":…,"claim":…}:
	// the claim is rebuilt from it when the checkpoint is lost. Version 1
	// was that data alone, with no version; version 3 added the GPU
	// records' sharing, as the checkpoint's version 2, and version 4 its
	// share, as the checkpoint's version 3.
	ClaimFormat = Format{Kind: "hwdra.io/claim", Version: 4, Unversioned: 1, Upgrades: map[int]func([]byte) ([]byte, error){
		1: same,
		2: same,
		3: same,
	}}
)

// same is the upgrade of a version whose data the next reads as it is
// (it only adds fields).
func same(doc []byte) ([]byte, error) { return doc, nil }

// ledgerV1 takes a version 1 ledger's entries.
func ledgerV1(doc []byte) ([]byte, error) {
	var v1 struct {
		Entries json.RawMessage `json:"entries"`
	}
	if err := json.Unmarshal(doc, &v1); err != nil {
		return nil, err
	}
	if v1.Entries == nil {
		return nil, fmt.Errorf("no entries")
	}
	return v1.Entries, nil
}
