// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package mps

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/hw"
)

// Spec is one control daemon: what it serves and the defaults it gives
// its clients.
type Spec struct {
	// ID names the daemon and its directories.
	ID string `json:"id"`
	// Owner is what the daemon is for: a claim's UID (a claim's MPS
	// devices, or one dedicated GPU share), or "share" for a GPU's
	// policed shares.
	Owner string `json:"owner"`
	// Share: the daemon is a dedicated GPU share's, of its own (Owner is
	// the share's claim, its defaults the share's limits).
	Share bool `json:"share,omitempty"`
	// Devices are the UUIDs of the GPUs or MIG devices it serves, its
	// CUDA_VISIBLE_DEVICES: its clients see them as devices 0, 1, ...
	Devices []string `json:"devices"`
	// Serves is the hardware of Devices, in order: a GPU (no placement) or
	// a MIG partition. Its devices are unhealthy while the daemon is down.
	Serves []hw.PartitionRef `json:"serves"`
	// ActiveThreadPercentage and PinnedMemoryLimit (bytes, on each
	// device) are the defaults the daemon gives every client; nil: none.
	ActiveThreadPercentage *int    `json:"activeThreadPercentage,omitempty"`
	PinnedMemoryLimit      *uint64 `json:"pinnedMemoryLimit,omitempty"`
}

// OwnerShares owns the daemon of a GPU's policed shares.
const OwnerShares = "share"

// ServesShares tells whether the daemon's clients are GPU shares: the
// GPU's policed shares, or one dedicated share. Its devices are then the
// GPU's share device, not the GPU itself.
func (s Spec) ServesShares() bool { return s.Owner == OwnerShares || s.Share }

// ID is the name of the daemon of owner (a claim's UID, or "share" for a
// GPU's policed shares) serving devices: short, so its pipe paths stay well
// within a Unix socket's 108 bytes, and the same every time.
func ID(owner string, devices []string) string {
	sum := sha256.Sum256([]byte(owner + "/" + strings.Join(devices, ",")))
	return hex.EncodeToString(sum[:])[:12]
}

// Dirs are a daemon's directories on the node.
type Dirs struct {
	// Pipe is CUDA_MPS_PIPE_DIRECTORY: the daemon's control pipe, where
	// clients find it. Log is CUDA_MPS_LOG_DIRECTORY. Shm is the daemon's
	// and its clients' /dev/shm.
	Pipe, Log, Shm string
}

// DirsOf are the directories of daemon id under root.
func DirsOf(root, id string) Dirs {
	d := filepath.Join(root, id)
	return Dirs{Pipe: filepath.Join(d, "pipe"), Log: filepath.Join(d, "log"), Shm: filepath.Join(d, "shm")}
}

// Commands are the control commands that give the spec's defaults to
// every client.
func (s Spec) Commands() []string {
	var out []string
	if p := s.ActiveThreadPercentage; p != nil {
		out = append(out, "set_default_active_thread_percentage "+strconv.Itoa(*p))
	}
	if m := s.PinnedMemoryLimit; m != nil {
		for i := range s.Devices {
			out = append(out, fmt.Sprintf("set_default_device_pinned_mem_limit %d %s", i, megabytes(*m)))
		}
	}
	return out
}

// env is what the daemon's environment says of it (Manager.env adds
// the driver's paths).
func (s Spec) env(d Dirs) []string {
	return []string{PipeDirEnv + "=" + d.Pipe, LogDirEnv + "=" + d.Log, "CUDA_VISIBLE_DEVICES=" + strings.Join(s.Devices, ",")}
}

// The environment of MPS clients and the daemon.
const (
	PipeDirEnv                = "CUDA_MPS_PIPE_DIRECTORY"
	LogDirEnv                 = "CUDA_MPS_LOG_DIRECTORY"
	ActiveThreadPercentageEnv = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	PinnedMemoryLimitEnv      = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)

// ContainerPipeDir is where a client container finds the daemon's pipe
// directory: MPS's default, so a program that ignores
// CUDA_MPS_PIPE_DIRECTORY finds it too.
const ContainerPipeDir = "/tmp/nvidia-mps"

// Limits are what one client container is held to, on each of its
// devices: the share of multiprocessors (percent) and the device memory
// (bytes); nil: the daemon's default.
type Limits struct {
	ActiveThreadPercentage *int
	PinnedMemoryLimit      *uint64
}

// ClientEdits are the CDI edits of a container that runs on the daemon:
// its pipe directory and shared memory mounted, the environment that
// points CUDA at the daemon and holds the container to limits on each of
// the daemon's devices. MPS clients take limits from their environment
// only below the daemon's defaults.
func (s Spec) ClientEdits(d Dirs, l Limits) *cdispec.ContainerEdits {
	e := &cdispec.ContainerEdits{
		Env: []string{PipeDirEnv + "=" + ContainerPipeDir},
		Mounts: []*cdispec.Mount{
			{HostPath: d.Pipe, ContainerPath: ContainerPipeDir, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
			// noexec as the tmpfs itself: the runtime remounts a bind
			// with exactly the options given.
			{HostPath: d.Shm, ContainerPath: "/dev/shm", Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		},
	}
	if p := l.ActiveThreadPercentage; p != nil {
		e.Env = append(e.Env, ActiveThreadPercentageEnv+"="+strconv.Itoa(*p))
	}
	if m := l.PinnedMemoryLimit; m != nil {
		per := make([]string, len(s.Devices))
		for i := range per {
			per[i] = fmt.Sprintf("%d=%s", i, megabytes(*m))
		}
		e.Env = append(e.Env, PinnedMemoryLimitEnv+"="+strings.Join(per, ","))
	}
	return e
}

// megabytes is a memory limit as MPS takes it, in whole megabytes
// (MiB), rounded down: a limit never grants more than was asked.
func megabytes(bytes uint64) string {
	return strconv.FormatUint(max(bytes>>20, 1), 10) + "M"
}
