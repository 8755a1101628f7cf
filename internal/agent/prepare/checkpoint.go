// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package prepare

import (
	"bytes"
	"encoding/json"
	"os"

	"k8s.io/apimachinery/pkg/types"
)

// ClaimState is how far a claim's preparation got.
type ClaimState string

const (
	// StatePreparing: side effects may have been applied; the record says
	// which. Found at start, the claim is rolled back.
	StatePreparing ClaimState = "Preparing"
	// StatePrepared: done; the kubelet has (or will get) the devices.
	StatePrepared ClaimState = "Prepared"
)

// Claim is one claim in the checkpoint.
type Claim[R any] struct {
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	State     ClaimState `json:"state"`
	// Devices is what prepare returned, replayed on a repeated prepare.
	Devices []Device `json:"devices,omitempty"`
	// Record is the driver's account of the side effects applied.
	Record R `json:"record"`
}

// Checkpoint is the state of one driver's prepared claims, kept in
// "<driver>.checkpoint.json" (state.CheckpointFormat). A published
// Checkpoint is never changed: readers hold it without a lock.
type Checkpoint[R any] struct {
	// BootID tells whether hardware state (MIG instances, VF settings)
	// survived: after a reboot it did not.
	BootID string                  `json:"bootID"`
	Claims map[types.UID]*Claim[R] `json:"claims"`
}

// decodeCheckpoint reads a checkpoint's data; a field it does not know is
// an error: the file is not what this agent wrote.
func decodeCheckpoint[R any](data []byte, cp *Checkpoint[R]) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(cp)
}

// BootID is the kernel's boot ID: it changes on every reboot.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(b))
}
