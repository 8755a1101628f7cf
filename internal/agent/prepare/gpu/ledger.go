// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/hw"
)

// ledgerEntry describes a GPU instance or mediated device the agent made,
// or the MIG mode a GPU had before the agent switched it, so that the
// state is undone when no prepared claim needs it any more, also after
// the claims' records are lost.
type ledgerEntry struct {
	GPU string `json:"gpu"`
	// GPU instance: profile and placement.
	Profile   int           `json:"profile,omitempty"`
	Placement *hw.Placement `json:"placement,omitempty"`
	// Mediated device.
	Mdev string `json:"mdev,omitempty"`
	// VF made a vGPU of VFType (the vendor-specific VFIO framework).
	VF     string `json:"vf,omitempty"`
	VFType uint   `json:"vfType,omitempty"`
	// MIGEnabled is the GPU's MIG mode before the agent first switched it.
	MIGEnabled *bool `json:"migEnabled,omitempty"`
	// ComputeMode and TimeSlice are a GPU's compute mode and time slice
	// before the agent first changed them (settingsKey).
	ComputeMode nvml.ComputeMode `json:"computeMode,omitempty"`
	TimeSlice   *int             `json:"timeSlice,omitempty"`
}

// Ledger keys: one constructor per kind of entry, and a predicate where
// Reclaim recognises the kind by its key. Keys are persisted (an older
// agent's ledger is read as it is): a changed format orphans its entries.
//
//	gi/<GPU>/<profile>/<placement start>  a GPU instance the agent made
//	mdev/<UUID>                           a mediated device (vGPU) it made
//	vf/<VF address>                       a VF it made a vGPU
//	migmode/<GPU>                         the GPU's MIG mode before it first switched it
//	settings/<GPU>                        the GPU's compute mode and time slice before it first changed them

// giKey is the ledger key of a GPU instance the agent made; mayUse keys
// an allocated MIG device's (or MIG-backed vGPU's) instance the same way.
func giKey(gpu string, profile int, at hw.Placement) string {
	return fmt.Sprintf("gi/%s/%d/%d", gpu, profile, at.Start)
}

func mdevKey(uuid string) string    { return "mdev/" + uuid }
func isMdevKey(key string) bool     { return strings.HasPrefix(key, mdevKey("")) }
func vfKey(vf string) string        { return "vf/" + vf }
func isVFKey(key string) bool       { return strings.HasPrefix(key, vfKey("")) }
func migKey(gpu string) string      { return "migmode/" + gpu }
func isMIGKey(key string) bool      { return strings.HasPrefix(key, migKey("")) }
func settingsKey(gpu string) string { return "settings/" + gpu }
func isSettingsKey(key string) bool { return strings.HasPrefix(key, settingsKey("")) }

// Keys of mayUse (Reclaim) beside giKey: what the devices allocated to
// the node and not prepared here may use.
//
//	gpu/<GPU>          its MIG mode and settings (any device of the GPU)
//	vgpu/<GPU>         its mediated devices and vGPU VFs (a vGPU of the GPU)
//	mps-claim/<claim>  the claim's MPS daemon (a claim allocated to the node)
//	mps-share/<GPU>    the daemon of the GPU's shares (an allocated share)
func gpuKey(gpu string) string        { return "gpu/" + gpu }
func vgpuKey(gpu string) string       { return "vgpu/" + gpu }
func mpsClaimKey(claim string) string { return "mps-claim/" + claim }
func mpsShareKey(gpu string) string   { return "mps-share/" + gpu }

// mpsKey names an MPS daemon that Reclaim keeps, in its list beside the
// ledger keys it keeps.
func mpsKey(id string) string { return "mps/" + id }

// recordSettings records what a GPU's settings were before a change, in
// the GPU's settings entry (kept from the first change on).
func (d *Driver) recordSettings(gpu string, set func(*ledgerEntry)) error {
	e, ok := d.ledger.Get(settingsKey(gpu))
	if !ok {
		e = ledgerEntry{GPU: gpu}
	}
	before := e
	set(&e)
	if ok && before == e {
		return nil
	}
	return d.ledger.Put(settingsKey(gpu), e)
}

// restoredSettings is the settings entry a record of a lost ledger
// implies: the defaults, if the record changed a setting.
func restoredSettings(gpu string, s *SharingRecord) *ledgerEntry {
	if s.ComputeMode == "" && s.TimeSlice == nil {
		return nil
	}
	e := &ledgerEntry{GPU: gpu}
	if s.ComputeMode != "" {
		e.ComputeMode = nvml.ComputeDefault
	}
	if s.TimeSlice != nil {
		e.TimeSlice = new(int)
	}
	return e
}

// own records that a claim uses the GPU instance at key; it fails when
// another prepared claim does.
func (d *Driver) own(key string, claim types.UID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if other, ok := d.owners[key]; ok && other != claim {
		return fmt.Errorf("the GPU instance (%s) is in use by claim %s", key, other)
	}
	d.owners[key] = claim
	return nil
}

func (d *Driver) disown(key string, claim types.UID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.owners[key] == claim {
		delete(d.owners, key)
	}
}

// use records that a claim uses a GPU.
func (d *Driver) use(gpu string, claim types.UID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	addUser(d.users, gpu, claim)
}

// release records that a claim no longer uses a GPU and tells whether the
// GPU is free now (and the driver knows all claims).
func (d *Driver) release(gpu string, claim types.UID) (free bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return dropUser(d.users, gpu, claim) && d.reconciled
}

// useMPS records that a claim uses an MPS daemon.
func (d *Driver) useMPS(id string, claim types.UID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	addUser(d.mpsUsers, id, claim)
}

// releaseMPS records that a claim no longer uses an MPS daemon and tells
// whether no claim does now (and the driver knows all claims: until then
// Reclaim stops it).
func (d *Driver) releaseMPS(id string, claim types.UID) (unused bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return dropUser(d.mpsUsers, id, claim) && d.reconciled
}

// addUser records in users (the driver's users or mpsUsers, d.mu held)
// that a claim uses what key names.
func addUser(users map[string]map[types.UID]bool, key string, claim types.UID) {
	if users[key] == nil {
		users[key] = map[types.UID]bool{}
	}
	users[key][claim] = true
}

// dropUser records in users (d.mu held) that a claim no longer uses what
// key names, and tells whether no claim does.
func dropUser(users map[string]map[types.UID]bool, key string, claim types.UID) (none bool) {
	delete(users[key], claim)
	if len(users[key]) > 0 {
		return false
	}
	delete(users, key)
	return true
}
