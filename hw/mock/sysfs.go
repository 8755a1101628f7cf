package mock

import (
	"fmt"
	"os"
	"path/filepath"
)

// pciDevice is what the fake sysfs tree records of one PCI function.
type pciDevice struct {
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

// devicePath is the device's directory relative to the sysfs root, the
// target of bus/pci/devices/<address> on a real machine.
func (d pciDevice) devicePath() string {
	parts := []string{"devices", d.Root}
	if d.Bridge != "" {
		parts = append(parts, d.Bridge)
	}
	return filepath.Join(append(parts, d.Address)...)
}

// writePCIDevice creates the device directory, its identity files and the
// bus/pci/devices and driver links, as the kernel lays them out.
func writePCIDevice(sysfs string, d pciDevice) error {
	dir := filepath.Join(sysfs, d.devicePath())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"vendor":    d.Vendor,
		"device":    d.Device,
		"class":     d.Class,
		"numa_node": fmt.Sprint(d.NUMANode),
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
