package prepare

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/slotfile"
)

// CheckpointVersion is the format this agent writes and reads. A file of
// another version is set aside, not guessed at.
const CheckpointVersion = "hwdra.io/checkpoint/v1"

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

// Checkpoint is the state of one driver's prepared claims.
type Checkpoint[R any] struct {
	// BootID tells whether hardware state (MIG instances, VF settings)
	// survived: after a reboot it did not.
	BootID string                  `json:"bootID"`
	Claims map[types.UID]*Claim[R] `json:"claims"`
}

// envelope is the file: a version, a checksum over data, the data.
type envelope struct {
	Version  string          `json:"version"`
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// ErrCorrupt marks a checkpoint file that cannot be trusted.
var ErrCorrupt = errors.New("checkpoint corrupt")

// ErrNewer marks a state file written by a newer agent (a downgrade): it
// is left as it is, for that agent to find again.
var ErrNewer = errors.New("written by a newer hwdra")

// newer reports whether version ("hwdra.io/checkpoint/v2") is a later
// version of the same file kind as ours ("hwdra.io/checkpoint/v1").
func newer(version, ours string) bool {
	prefix, n, ok := strings.Cut(ours, "/v")
	if !ok {
		return false
	}
	rest, found := strings.CutPrefix(version, prefix+"/v")
	theirs, err1 := strconv.Atoi(rest)
	mine, err2 := strconv.Atoi(n)
	return found && err1 == nil && err2 == nil && theirs > mine
}

// ownPath is where this agent keeps a state file whose usual path holds a
// newer agent's: beside it, named by our version.
func ownPath(path, version string) string {
	_, v, _ := strings.Cut(version, "/v")
	return strings.TrimSuffix(path, ".json") + ".v" + v + ".json"
}

// readCheckpoint loads a checkpoint. A missing file is an empty checkpoint
// (found false).
func readCheckpoint[R any](path string) (cp *Checkpoint[R], found bool, err error) {
	cp = &Checkpoint[R]{Claims: map[types.UID]*Claim[R]{}}
	raw, err := slotfile.Read(path)
	if errors.Is(err, slotfile.ErrCorrupt) {
		return nil, true, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if err != nil {
		return nil, false, err
	}
	if raw == nil {
		return cp, false, nil
	}
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, true, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	if newer(env.Version, CheckpointVersion) {
		return nil, true, fmt.Errorf("%w: %s: version %q, this agent reads %q", ErrNewer, path, env.Version, CheckpointVersion)
	}
	if env.Version != CheckpointVersion {
		return nil, true, fmt.Errorf("%w: %s: version %q, this agent reads %q", ErrCorrupt, path, env.Version, CheckpointVersion)
	}
	if sum := checksum(env.Data); sum != env.Checksum {
		return nil, true, fmt.Errorf("%w: %s: checksum %s, content hashes to %s", ErrCorrupt, path, env.Checksum, sum)
	}
	dec := json.NewDecoder(bytes.NewReader(env.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cp); err != nil {
		return nil, true, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	if cp.Claims == nil {
		cp.Claims = map[types.UID]*Claim[R]{}
	}
	return cp, true, nil
}

// encodeCheckpoint is the checkpoint as its file holds it (in a slotfile:
// replaced atomically, whole or not at all, at any crash).
func encodeCheckpoint[R any](cp *Checkpoint[R]) ([]byte, error) {
	data, err := json.Marshal(cp)
	if err != nil {
		return nil, err
	}
	return json.Marshal(envelope{Version: CheckpointVersion, Checksum: checksum(data), Data: data})
}

func checksum(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// setAside moves an unreadable file out of the way, keeping it for a human
// to inspect, and says where it went.
func setAside(path string, now time.Time) (string, error) {
	moved, err := slotfile.SetAside(path, ".corrupt-"+now.UTC().Format("20060102T150405Z"))
	return strings.Join(moved, ", "), err
}

// BootID is the kernel's boot ID: it changes on every reboot.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(b))
}
