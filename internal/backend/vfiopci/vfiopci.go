// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package vfiopci finds the NVIDIA GPUs bound to vfio-pci, which NVML
// cannot see: a GPU an operator (or the agent) handed to VFIO for
// whole-GPU passthrough into a VM. It reads the PCI bus through ghw
// (github.com/jaypipes/ghw), names the devices from the PCI IDs database
// (github.com/jaypipes/pcidb; Debian's pci.ids package), and checks that
// a device's IOMMU group can be opened.
package vfiopci

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jaypipes/ghw"
	"github.com/jaypipes/ghw/pkg/pci"
	"github.com/jaypipes/pcidb"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/hwdra/hwdra/internal/hw"
)

// Driver is the kernel's VFIO PCI driver.
const Driver = "vfio-pci"

// NVIDIA's PCI vendor ID and the display classes its GPUs report: VGA
// (0300, boards with display outputs) and 3D controller (0302, data
// center GPUs).
const (
	nvidiaVendor   = "10de"
	displayClass   = "03"
	vgaSubclass    = "00"
	threeDSubclass = "02"
)

// Scanner finds vfio-pci GPUs under a sysfs root.
type Scanner struct {
	sysfs string
	names *names
}

// New scans the sysfs at sysfs ("/sys" on a host; it must be a directory
// named sys: ghw reads it as <root>/sys). Product names come from the PCI
// IDs database of this machine (pcidb's usual places,
// /usr/share/hwdata/pci.ids, /usr/share/misc/pci.ids, or $PCIDB_PATH).
func New(sysfs string) (*Scanner, error) {
	if filepath.Base(sysfs) != "sys" {
		return nil, fmt.Errorf("sysfs root %q: ghw reads PCI devices from <root>/sys, so it must end in /sys", sysfs)
	}
	return &Scanner{sysfs: sysfs, names: &names{byID: map[string]string{}}}, nil
}

// GPUs lists the NVIDIA display devices bound to vfio-pci, sorted by PCI
// address.
func (s *Scanner) GPUs() ([]hw.PassthroughGPU, error) {
	// An empty database: ghw would parse the whole PCI IDs file on every
	// scan and keep it; names are looked up (and kept) per device ID.
	info, err := pci.New(ghw.WithChroot(filepath.Dir(s.sysfs)), ghw.WithPCIDB(&pcidb.PCIDB{}),
		ghw.WithDisableTopology(), ghw.WithDisableWarnings(), ghw.WithDisableTools())
	if err != nil {
		return nil, fmt.Errorf("PCI devices: %w", err)
	}
	var out []hw.PassthroughGPU
	for _, d := range info.Devices {
		if d.Vendor == nil || d.Product == nil || d.Class == nil || d.Subclass == nil ||
			d.Vendor.ID != nvidiaVendor || d.Class.ID != displayClass ||
			d.Subclass.ID != vgaSubclass && d.Subclass.ID != threeDSubclass || d.Driver != Driver {
			continue
		}
		g := hw.PassthroughGPU{PCIBusID: d.Address, VendorID: d.Vendor.ID, DeviceID: d.Product.ID,
			ProductName: s.names.product(d.Vendor.ID, d.Product.ID), NUMANode: s.numaNode(d.Address), PCIeRoot: s.pcieRoot(d.Address)}
		if g.IOMMUGroup, err = strconv.Atoi(d.IOMMUGroup); err != nil {
			return nil, fmt.Errorf("GPU %s is bound to %s but has no IOMMU group (%q): is the IOMMU on?", d.Address, Driver, d.IOMMUGroup)
		}
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b hw.PassthroughGPU) int { return strings.Compare(a.PCIBusID, b.PCIBusID) })
	return out, nil
}

func (s *Scanner) numaNode(addr string) int {
	raw, err := os.ReadFile(filepath.Join(s.sysfs, "bus/pci/devices", addr, "numa_node"))
	n, perr := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || perr != nil || n < 0 {
		return hw.UnknownNUMANode
	}
	return n
}

func (s *Scanner) pcieRoot(addr string) string {
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(addr, deviceattribute.WithFSFromRoot(s.sysfs))
	if err != nil || attr.Value.StringValue == nil {
		return ""
	}
	return *attr.Value.StringValue
}

// names looks product names up in the PCI IDs database, loading it only
// for an ID not seen yet and dropping it after: parsed, the database
// holds every PCI product known (tens of thousands), which an agent that
// names a handful of GPUs need not keep.
type names struct {
	mu   sync.Mutex
	byID map[string]string
}

func (n *names) product(vendor, device string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	key := vendor + device
	if name, ok := n.byID[key]; ok {
		return name
	}
	name := "NVIDIA device " + device
	if db, err := pcidb.New(); err == nil {
		if p := db.Products[key]; p != nil && p.Name != "" {
			name = p.Name
		}
	}
	n.byID[key] = name
	return name
}

// GroupViable checks that a VFIO group can be opened: the kernel refuses
// a group while any of its devices is bound to a driver that is no VFIO
// driver (vfio-pci or a variant driver such as the vGPU manager's; a
// GPU's audio function left on snd_hda_intel is the usual case); PCIe
// ports (bridges) and unbound devices are allowed.
func GroupViable(sysfs string, group int) error {
	dir := filepath.Join(sysfs, "kernel/iommu_groups", strconv.Itoa(group), "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("IOMMU group %d: %w", group, err)
	}
	var bad []string
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name(), "driver"))
		if err != nil {
			continue // unbound
		}
		if drv := filepath.Base(target); !strings.Contains(drv, "vfio") && drv != "pcieport" {
			bad = append(bad, e.Name()+" ("+drv+")")
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("IOMMU group %d is not viable for VFIO: %s must be bound to %s too (or unbound)", group, strings.Join(bad, ", "), Driver)
	}
	return nil
}

// Group is an IOMMU group's VFIO group device as the kernel publishes it
// (/sys/class/vfio/<name>/dev).
type Group struct {
	Number int
	// Node is its name under /dev/vfio: the group's number, or
	// noiommu-<number> where the kernel runs VFIO without an IOMMU.
	Node string
	// NoIOMMU: the kernel runs VFIO without an IOMMU (the vfio module's
	// enable_unsafe_noiommu_mode): nothing confines the device's DMA, so
	// whoever opens the group can read and write all of the node's memory.
	NoIOMMU      bool
	Major, Minor int64
}

// VFIOGroup reads the VFIO group device of an IOMMU group.
func VFIOGroup(sysfs string, group int) (Group, error) {
	n := strconv.Itoa(group)
	for _, g := range []Group{{Number: group, Node: n}, {Number: group, Node: "noiommu-" + n, NoIOMMU: true}} {
		raw, err := os.ReadFile(filepath.Join(sysfs, "class", "vfio", g.Node, "dev"))
		if err != nil {
			continue
		}
		if _, err := fmt.Sscanf(strings.TrimSpace(string(raw)), "%d:%d", &g.Major, &g.Minor); err != nil {
			return Group{}, fmt.Errorf("VFIO group %s: dev %q: %w", g.Node, raw, err)
		}
		return g, nil
	}
	return Group{}, fmt.Errorf("IOMMU group %d has no VFIO group device (%s): is the device bound to a VFIO driver?",
		group, filepath.Join(sysfs, "class", "vfio", n))
}

// NoIOMMUGroups lists the VFIO groups of a kernel that runs VFIO without
// an IOMMU, each with the PCI functions in it, by number.
func NoIOMMUGroups(sysfs string) (map[int][]string, error) {
	entries, err := os.ReadDir(filepath.Join(sysfs, "class", "vfio"))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	out := map[int][]string{}
	for _, e := range entries {
		num, ok := strings.CutPrefix(e.Name(), "noiommu-")
		n, err := strconv.Atoi(num)
		if !ok || err != nil {
			continue
		}
		devs, _ := os.ReadDir(filepath.Join(sysfs, "kernel", "iommu_groups", num, "devices"))
		out[n] = []string{}
		for _, d := range devs {
			out[n] = append(out[n], d.Name())
		}
	}
	return out, nil
}

// RefuseNoIOMMU is the error for a device (what: "VF 0000:17:01.2") in a
// VFIO group without an IOMMU, handed out only where the agent's
// vfio.allowUnsafeNoIOMMU says so; nil for a group an IOMMU isolates.
func RefuseNoIOMMU(what string, g Group, allowed bool) error {
	if !g.NoIOMMU || allowed {
		return nil
	}
	return fmt.Errorf("%s is in VFIO group %s: the kernel runs VFIO without an IOMMU (the vfio module's enable_unsafe_noiommu_mode), so nothing confines "+
		"the device's DMA and whoever opens /dev/vfio/%s can read and write all of the node's memory: refused, as the agent's "+
		"configuration has vfio.allowUnsafeNoIOMMU off (turn the IOMMU on: intel_iommu=on or AMD-Vi, then reboot)", what, g.Node, g.Node)
}
