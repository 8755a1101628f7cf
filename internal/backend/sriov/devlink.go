// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import "github.com/vishvananda/netlink"

// EswitchSource reports a PCI device's devlink eswitch mode ("legacy",
// "switchdev"), or an error when the device has none.
type EswitchSource interface {
	EswitchMode(pciAddress string) (string, error)
}

// Devlink asks the kernel over generic netlink. Drivers without devlink
// eswitch support (most but mlx5, ice, nfp) answer with an error, and
// Discover then leaves the mode empty.
type Devlink struct{}

// EswitchMode implements EswitchSource.
func (Devlink) EswitchMode(pciAddress string) (string, error) {
	dev, err := netlink.DevLinkGetDeviceByName("pci", pciAddress)
	if err != nil {
		return "", err
	}
	return dev.Attrs.Eswitch.Mode, nil
}
