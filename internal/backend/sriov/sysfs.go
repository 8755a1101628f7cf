// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// DeviceError is a problem with one PCI device's sysfs entry. It names the
// device and the file so an operator can look at the same place.
type DeviceError struct {
	PCIAddress string
	// File is relative to the device directory ("net/ens1f0/mtu").
	File string
	Err  error
}

func (e *DeviceError) Error() string {
	return fmt.Sprintf("sriov: %s: %s: %v", e.PCIAddress, e.File, e.Err)
}

func (e *DeviceError) Unwrap() error { return e.Err }

// ErrDanglingLink marks a symlink whose target is gone: a VF being removed
// while sriov_numvfs changes, a driver being unbound.
var ErrDanglingLink = errors.New("dangling symlink")

// device reads the sysfs entries of one PCI device,
// <root>/bus/pci/devices/<address>/..., and names it in its errors.
type device struct {
	root    string // the sysfs root
	address string
	dir     string // <root>/bus/pci/devices/<address>
}

func newDevice(root, address string) device {
	return device{root: root, address: address, dir: filepath.Join(root, "bus", "pci", "devices", address)}
}

// resolved points dir at the device's real directory under devices/, so
// reading its files walks no symlink. Unchanged if the link is unreadable.
func (d device) resolved() device {
	target, err := os.Readlink(d.dir)
	if err != nil {
		return d
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(d.dir), target)
	}
	d.dir = target
	return d
}

// readlink returns a symlink's target as written (no existence check).
func (d device) readlink(file string) (string, error) {
	target, err := os.Readlink(filepath.Join(d.dir, file))
	if err != nil {
		return "", d.err(file, unwrapPath(err))
	}
	return target, nil
}

func (d device) err(file string, err error) error {
	return &DeviceError{PCIAddress: d.address, File: file, Err: err}
}

// read returns the trimmed content of a file under the device directory.
// A missing file is reported as fs.ErrNotExist (wrapped), so callers can
// treat "absent" as a value.
func (d device) read(file string) (string, error) {
	s, err := readAttr(filepath.Join(d.dir, file))
	if err != nil {
		return "", d.err(file, err)
	}
	return s, nil
}

// readAttr reads a sysfs attribute with open, one read and close: sysfs
// hands out at most a page per attribute, in one read. (os.ReadFile adds
// an fstat and a second read, which adds up over hundreds of VFs.)
func readAttr(path string) (string, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	var buf [4096]byte
	for {
		n, err := unix.Read(fd, buf[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(buf[:n])), nil
	}
}

func (d device) readInt(file string) (int, error) {
	s, err := d.read(file)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, d.err(file, fmt.Errorf("not an integer: %q", s))
	}
	return n, nil
}

// readHexID reads a "0x15b3"-style ID file as "15b3".
func (d device) readHexID(file string) (string, error) {
	s, err := d.read(file)
	if err != nil {
		return "", err
	}
	id := strings.ToLower(strings.TrimPrefix(s, "0x"))
	if _, err := strconv.ParseUint(id, 16, 32); err != nil || id == "" {
		return "", d.err(file, fmt.Errorf("not a hex ID: %q", s))
	}
	return id, nil
}

// linkTarget returns the last element of a symlink's target, e.g. the
// driver name of "driver" or the PCI address of "virtfn3". It also checks
// that the target exists: a dangling link (a VF being removed, a driver
// being unbound) is an error naming the link.
func (d device) linkTarget(file string) (string, error) {
	p := filepath.Join(d.dir, file)
	target, err := d.readlink(file)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(p); err != nil {
		// %v, not %w: a dangling link is not a missing file to the callers.
		return "", d.err(file, fmt.Errorf("%w to %s: %v", ErrDanglingLink, target, unwrapPath(err)))
	}
	return filepath.Base(target), nil
}

// list returns the names in a directory under the device directory, nil
// (and no error) when it does not exist.
func (d device) list(dir string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(d.dir, dir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, d.err(dir, unwrapPath(err))
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names, nil
}

func (d device) exists(file string) bool {
	_, err := os.Stat(filepath.Join(d.dir, file))
	return err == nil
}

// unwrapPath drops the *fs.PathError around an error: DeviceError names
// the file already, relative to the device.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// isNotExist reports a missing file.
func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// isInvalid reports EINVAL, which several netdev attributes return on read
// while the link is down (speed, duplex, carrier of an admin-down link).
func isInvalid(err error) bool { return errors.Is(err, syscall.EINVAL) }
