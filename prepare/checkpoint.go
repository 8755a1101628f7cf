package prepare

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/types"
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

// readCheckpoint loads a checkpoint. A missing file is an empty checkpoint.
func readCheckpoint[R any](path string) (*Checkpoint[R], error) {
	cp := &Checkpoint[R]{Claims: map[types.UID]*Claim[R]{}}
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cp, nil
	}
	if err != nil {
		return nil, err
	}
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	if env.Version != CheckpointVersion {
		return nil, fmt.Errorf("%w: %s: version %q, this agent reads %q", ErrCorrupt, path, env.Version, CheckpointVersion)
	}
	if sum := checksum(env.Data); sum != env.Checksum {
		return nil, fmt.Errorf("%w: %s: checksum %s, content hashes to %s", ErrCorrupt, path, env.Checksum, sum)
	}
	dec := json.NewDecoder(bytes.NewReader(env.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cp); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	if cp.Claims == nil {
		cp.Claims = map[types.UID]*Claim[R]{}
	}
	return cp, nil
}

// writeCheckpoint replaces the file atomically: a crash at any point leaves
// either the old or the new content, never a mix.
func writeCheckpoint[R any](path string, cp *Checkpoint[R]) error {
	data, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(envelope{Version: CheckpointVersion, Checksum: checksum(data), Data: data})
	if err != nil {
		return err
	}
	return writeFile(path, raw, true)
}

func checksum(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// writeFile replaces a file atomically: temp file in the same folder,
// rename. With durable, the temp file is fsynced before the rename and the
// folder after it (without that the rename itself may not survive a power
// loss).
func writeFile(path string, data []byte, durable bool) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if !durable {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// setAside moves an unreadable checkpoint out of the way, keeping it for a
// human to inspect, and returns where it went.
func setAside(path string, now time.Time) (string, error) {
	dest := fmt.Sprintf("%s.corrupt-%s", path, now.UTC().Format("20060102T150405Z"))
	return dest, os.Rename(path, dest)
}

// BootID is the kernel's boot ID: it changes on every reboot.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(b))
}
