// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nodefs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Character device numbers both sides of the node use. 10 is the kernel's
// misc major (/dev/vfio/vfio is misc 196); the VFIO group major is
// allocated dynamically by the kernel on a real node, so any value is
// plausible: this one is in the range it hands out.
const (
	MiscMajor     = 10
	VFIOMajor     = 509
	VFIOMiscMinor = 196
)

// CanMknod reports whether the mock creates device nodes (it runs as root).
func CanMknod() bool { return os.Geteuid() == 0 }

// Dev is the mock node's /dev. Running as root the mock creates real
// character devices there, so that a CDI spec pointing at them can be
// injected and a runtime can create them in a container; otherwise the
// directory stays without device nodes.
type Dev struct {
	Root  string
	mknod bool
	// NoIOMMU: the kernel runs VFIO without an IOMMU (profile noIOMMU).
	NoIOMMU bool
}

// NewDev is the /dev at root.
func NewDev(root string) *Dev { return &Dev{Root: root, mknod: CanMknod()} }

// Node creates a character device under the root (as root only); one that
// exists is kept.
func (d *Dev) Node(name string, major, minor uint32) error {
	if !d.mknod {
		return nil
	}
	path := filepath.Join(d.Root, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor)))
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mknod %s: %w", path, err)
	}
	return nil
}
