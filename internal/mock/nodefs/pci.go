// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package nodefs writes what the GPU and NIC simulations share of a mock
// node's file trees: PCI functions in sysfs as the kernel lays them out,
// character device nodes in /dev (as root), and the device numbers both
// sides use.
package nodefs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// PCIDevice is what the fake sysfs tree records of one PCI function.
type PCIDevice struct {
	Address string // "0000:3b:00.0"
	// Root is the PCIe root complex directory ("pci0000:00"); Bridge an
	// optional upstream port between the root and the device.
	Root, Bridge string
	NUMANode     int
	Vendor       string // "0x10de"
	Device       string // "0x2330"
	Class        string // "0x030200"
	Driver       string // bound driver name, "" for none
}

// Path is the device's directory relative to the sysfs root, the target
// of bus/pci/devices/<address> on a real machine.
func (d PCIDevice) Path() string {
	parts := []string{"devices", d.Root}
	if d.Bridge != "" {
		parts = append(parts, d.Bridge)
	}
	return filepath.Join(append(parts, d.Address)...)
}

// Modalias is the device's modalias as the kernel writes it
// ("pci:v000010DEd00002330sv000010DEsd00000000bc03sc02i00"): the
// identity udev and PCI tools (ghw among them) read, every field
// fixed-width. The mock's devices have their own vendor as subsystem
// vendor and no subsystem device.
func (d PCIDevice) Modalias() string {
	hex := func(s string) uint64 {
		v, _ := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 32) // the mock's own IDs: always hex
		return v
	}
	vendor, class := hex(d.Vendor), hex(d.Class)
	return fmt.Sprintf("pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X",
		vendor, hex(d.Device), vendor, 0, class>>16&0xff, class>>8&0xff, class&0xff)
}

// WritePCIDevice creates the device directory, its identity files and the
// bus/pci/devices and driver links, as the kernel lays them out.
func WritePCIDevice(sysfs string, d PCIDevice) error {
	dir := filepath.Join(sysfs, d.Path())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"vendor":    d.Vendor,
		"device":    d.Device,
		"class":     d.Class,
		"numa_node": fmt.Sprint(d.NUMANode),
		"modalias":  d.Modalias(),
	}
	for name, value := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(value+"\n"), 0o644); err != nil {
			return err
		}
	}
	busDir := filepath.Join(sysfs, "bus", "pci", "devices")
	if err := os.MkdirAll(busDir, 0o755); err != nil {
		return err
	}
	rel, err := filepath.Rel(busDir, dir)
	if err != nil {
		return err
	}
	if err := os.Symlink(rel, filepath.Join(busDir, d.Address)); err != nil {
		return err
	}
	if d.Driver != "" {
		return bindDriver(sysfs, d.Address, d.Driver)
	}
	return nil
}

// bindDriver links the device to a driver directory under bus/pci/drivers.
func bindDriver(sysfs, address, driver string) error {
	drvDir := filepath.Join(sysfs, "bus", "pci", "drivers", driver)
	if err := os.MkdirAll(drvDir, 0o755); err != nil {
		return err
	}
	devLink := filepath.Join(sysfs, "bus", "pci", "devices", address)
	dev, err := filepath.EvalSymlinks(devLink)
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(dev, drvDir)
	if err != nil {
		return err
	}
	link := filepath.Join(dev, "driver")
	_ = os.Remove(link)
	if err := os.Symlink(rel, link); err != nil {
		return err
	}
	back, err := filepath.Rel(drvDir, dev)
	if err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(drvDir, address))
	return os.Symlink(back, filepath.Join(drvDir, address))
}

// CanonicalAddress accepts a PCI address in the forms NVML accepts
// ("0000:1b:00.0", "00000000:1B:00.0") and returns the canonical one.
func CanonicalAddress(s string) (string, bool) {
	var domain, bus, dev, fn uint32
	var rest string
	n, _ := fmt.Sscanf(strings.ToLower(s), "%x:%x:%x.%x%s", &domain, &bus, &dev, &fn, &rest)
	if n != 4 || domain > 0xffff || bus > 0xff || dev > 0x1f || fn > 7 {
		return "", false
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus, dev, fn), true
}
