// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/hwdra/hwdra/internal/hw"
)

// Link reads the link of PF pf as Discover does (LinkUp, SpeedMbps), for
// the health monitor's checks between probes. A missing netdev (removed,
// renamed) is an error wrapping fs.ErrNotExist.
func Link(sysfsRoot string, pf hw.PF) (hw.PF, error) {
	if sysfsRoot == "" {
		sysfsRoot = DefaultSysfsRoot
	}
	d := newDevice(sysfsRoot, pf.PCIAddress)
	if _, err := os.Stat(filepath.Join(d.dir, "net", pf.Netdev)); err != nil {
		return pf, d.err(filepath.Join("net", pf.Netdev), unwrapPath(err))
	}
	pf.LinkUp, pf.SpeedMbps = false, 0
	var problems []error
	readNetdev(d, &pf, &problems)
	return pf, errors.Join(problems...)
}

// VFPresent reports whether a VF's PCI function still exists (a VF's
// netdev leaving the host namespace, into a pod, is no reason to think
// it gone).
func VFPresent(sysfsRoot, vfAddress string) bool {
	if sysfsRoot == "" {
		sysfsRoot = DefaultSysfsRoot
	}
	_, err := os.Stat(filepath.Join(sysfsRoot, "bus", "pci", "devices", vfAddress))
	return err == nil
}
