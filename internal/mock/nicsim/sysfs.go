// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nicsim

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/nodefs"
)

// treeWriter writes NICs into the fake sysfs tree the way the kernel lays
// them out, numbering ifindexes and RDMA devices as it goes.
type treeWriter struct {
	sysfs      string
	ifindex    int
	rdma       int // next mlx5_<n> / irdma<n>, auxiliary device id and uverbs<n>
	iommuGroup int // next VF IOMMU group
	dev        *nodefs.Dev
	rdmaCM     bool // /sys/class/misc/rdma_cm written
	rdmaNames  []string
	vfio       bool // /sys/class/misc/vfio written
}

// Character devices of the NIC side. ib_uverbs has the fixed major 231
// with minors from 192 (its first 32 devices); rdma_cm and vfio are misc
// devices (major 10), vfio at its fixed minor 196 and rdma_cm at a
// dynamic one. VFIO group nodes use the mock's VFIO major.
const (
	uverbsMajor     = 231
	uverbsBaseMinor = 192
	rdmaCMMinor     = 58
)

// firstNICIOMMUGroup numbers the VFs' IOMMU groups (one each, as on a
// host with ACS), above the range the vGPU mock's mediated devices use.
const firstNICIOMMUGroup = 512

// PCI class codes: Ethernet and InfiniBand controllers.
const (
	classEthernet   = "0x020000"
	classInfiniBand = "0x020700"
)

func (w *treeWriter) writePF(pf *mockPF) error {
	class := classEthernet
	if pf.linkType == hw.LinkInfiniBand {
		class = classInfiniBand
	}
	d := nodefs.PCIDevice{
		Address: pf.addr.String(), Root: pf.root, Bridge: pf.bridge, NUMANode: pf.numa,
		Vendor: "0x" + pf.model.Vendor, Device: "0x" + pf.model.Device, Class: class, Driver: pf.model.Driver,
	}
	if err := writeNewPCIDevice(w.sysfs, d); err != nil {
		return err
	}
	dir := filepath.Join(w.sysfs, d.Path())
	if err := writeFiles(dir, map[string]string{
		"sriov_totalvfs":          strconv.Itoa(pf.totalVFs),
		"sriov_numvfs":            strconv.Itoa(len(pf.vfs)),
		"sriov_offset":            strconv.Itoa(pf.vfOffset() - pf.addr.rid),
		"sriov_stride":            "1",
		"sriov_vf_device":         pf.model.VFDevice,
		"sriov_drivers_autoprobe": "1",
	}); err != nil {
		return err
	}
	nd := netdev{name: pf.netdev, mac: pfMAC(pf), mtu: pf.mtu, linkType: pf.linkType, up: pf.linkUp, speedMbps: pf.speedMbps}
	if pf.eswitch == "switchdev" {
		nd.portName = fmt.Sprintf("p%d", pf.addr.fn())
	}
	if err := w.writeNetdev(dir, nd); err != nil {
		return err
	}
	if pf.eswitch == "switchdev" {
		// VF representors share the PF's PCI device; only phys_port_name
		// tells them from the uplink.
		for _, vf := range pf.vfs {
			rep := netdev{name: fmt.Sprintf("%sr%d", pf.netdev, vf.index), mac: vfMAC(pf, vf.index), mtu: 1500,
				linkType: hw.LinkEthernet, portName: fmt.Sprintf("pf%dvf%d", pf.addr.fn(), vf.index)}
			if err := w.writeNetdev(dir, rep); err != nil {
				return err
			}
		}
	}
	if pf.rdma {
		return w.writeRDMA(dir, pf)
	}
	return nil
}

func (w *treeWriter) writeVF(pf *mockPF, vf *mockVF) error {
	pfDir := filepath.Join(w.sysfs, nodefs.PCIDevice{Address: pf.addr.String(), Root: pf.root, Bridge: pf.bridge}.Path())
	class := classEthernet
	if pf.linkType == hw.LinkInfiniBand {
		class = classInfiniBand
	}
	d := nodefs.PCIDevice{
		Address: vf.addr.String(), Root: pf.root, Bridge: pf.bridge, NUMANode: pf.numa,
		Vendor: "0x" + pf.model.Vendor, Device: "0x" + pf.model.VFDevice, Class: class, Driver: pf.vfDriver,
	}
	if err := writeNewPCIDevice(w.sysfs, d); err != nil {
		return err
	}
	dir := filepath.Join(w.sysfs, d.Path())
	if err := os.Symlink(filepath.Join("..", pf.addr.String()), filepath.Join(dir, "physfn")); err != nil {
		return err
	}
	if err := os.Symlink(filepath.Join("..", vf.addr.String()), filepath.Join(pfDir, fmt.Sprintf("virtfn%d", vf.index))); err != nil {
		return err
	}
	if err := w.writeIOMMUGroup(dir, vf.addr.String(), pf.vfDriver == "vfio-pci"); err != nil {
		return err
	}
	if vf.netdev == "" {
		return nil // vfio-pci or unbound: no netdev, no RDMA device
	}
	// VF netdevs come up administratively down, with no carrier.
	if err := w.writeNetdev(dir, netdev{name: vf.netdev, mac: vf.mac, mtu: pf.mtu, linkType: pf.linkType}); err != nil {
		return err
	}
	if pf.rdma && pf.model.VFRDMA {
		return w.writeRDMA(dir, pf)
	}
	return nil
}

// writeNewPCIDevice is nodefs.WritePCIDevice with a clear error when two mock
// devices get the same address.
func writeNewPCIDevice(sysfs string, d nodefs.PCIDevice) error {
	if _, err := os.Lstat(filepath.Join(sysfs, "bus", "pci", "devices", d.Address)); err == nil {
		return fmt.Errorf("PCI address %s is used twice in the profile", d.Address)
	}
	return nodefs.WritePCIDevice(sysfs, d)
}

type netdev struct {
	name, mac string
	mtu       int
	linkType  hw.LinkType
	up        bool
	speedMbps int
	portName  string // phys_port_name, "" for none
}

// writeNetdev creates <dev>/net/<name>/ and /sys/class/net/<name>,
// numbering ifindexes as the kernel does at boot.
func (w *treeWriter) writeNetdev(devDir string, nd netdev) error {
	w.ifindex++
	return writeNetdevFiles(w.sysfs, devDir, nd, w.ifindex)
}

// writeNetdevFiles creates <dev>/net/<name>/ and /sys/class/net/<name>.
func writeNetdevFiles(sysfs, devDir string, nd netdev, ifindex int) error {
	dir := filepath.Join(devDir, "net", nd.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	typ, mac := "1", nd.mac
	if nd.linkType == hw.LinkInfiniBand {
		// IPoIB hardware address: 4 bytes QPN and flags + the 16-byte GID.
		typ, mac = "32", "00:00:10:49:fe:80:00:00:00:00:00:00:"+nd.mac+":00:00"
	}
	state, carrier, speed := "down", "0", "-1" // ethtool's SPEED_UNKNOWN
	if nd.up {
		state, carrier, speed = "up", "1", strconv.Itoa(nd.speedMbps)
	}
	files := map[string]string{
		"address":   mac,
		"mtu":       strconv.Itoa(nd.mtu),
		"type":      typ,
		"operstate": state,
		"carrier":   carrier,
		"speed":     speed,
		"ifindex":   strconv.Itoa(ifindex),
	}
	if nd.portName != "" {
		files["phys_port_name"] = nd.portName
	}
	if err := writeFiles(dir, files); err != nil {
		return err
	}
	if err := os.Symlink(filepath.Join("..", "..", "..", filepath.Base(devDir)), filepath.Join(dir, "device")); err != nil {
		return err
	}
	return classLink(sysfs, "net", nd.name, dir)
}

// removeNetdev removes what writeNetdevFiles wrote: the netdev left the
// namespace whose sysfs this is, or was renamed.
func removeNetdev(sysfs, devDir, name string) error {
	if err := os.Remove(filepath.Join(sysfs, "class", "net", name)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return os.RemoveAll(filepath.Join(devDir, "net", name))
}

// vfDeviceDir is the real directory of a PCI function in the tree.
func vfDeviceDir(sysfs, addr string) string {
	p := filepath.Join(sysfs, "bus", "pci", "devices", addr)
	if real, err := filepath.EvalSymlinks(p); err == nil {
		return real
	}
	return p
}

// writeRDMA creates the RDMA device under the function's auxiliary device
// (<dev>/mlx5_core.rdma.<n>/infiniband/mlx5_<n>), the layout since 5.11.
func (w *treeWriter) writeRDMA(devDir string, pf *mockPF) error {
	n := w.rdma
	w.rdma++
	aux := filepath.Join(devDir, fmt.Sprintf("%s.%d", pf.model.RDMAAux, n))
	name := fmt.Sprintf("%s%d", pf.model.RDMAName, n)
	w.rdmaNames = append(w.rdmaNames, name)
	dir := filepath.Join(aux, "infiniband", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := w.classLink("infiniband", name, dir); err != nil {
		return err
	}
	// The verbs node (/dev/infiniband/uverbs<n>) is a sibling class device
	// with the same parent, naming its RDMA device in ibdev.
	uverbs := fmt.Sprintf("uverbs%d", n)
	vdir := filepath.Join(aux, "infiniband_verbs", uverbs)
	minor := uverbsBaseMinor + n
	if err := writeFilesIn(vdir, map[string]string{"ibdev": name, "dev": fmt.Sprintf("%d:%d", uverbsMajor, minor)}); err != nil {
		return err
	}
	if err := w.classLink("infiniband_verbs", uverbs, vdir); err != nil {
		return err
	}
	if err := w.dev.Node("infiniband/"+uverbs, uverbsMajor, uint32(minor)); err != nil {
		return err
	}
	if !w.rdmaCM {
		w.rdmaCM = true
		return w.miscDevice("rdma_cm", "infiniband/rdma_cm", rdmaCMMinor)
	}
	return nil
}

// writeIOMMUGroup puts a VF in an IOMMU group of its own; bound to
// vfio-pci it also gets its VFIO group node (/sys/class/vfio/<group>,
// /dev/vfio/<group>) and the node has /dev/vfio/vfio.
func (w *treeWriter) writeIOMMUGroup(devDir, addr string, vfio bool) error {
	g := w.iommuGroup
	w.iommuGroup++
	if err := nodefs.LinkIOMMUGroup(w.sysfs, devDir, addr, g); err != nil {
		return err
	}
	if !vfio {
		return nil
	}
	if err := w.dev.VFIOGroup(w.sysfs, g, uint32(g-firstNICIOMMUGroup), false); err != nil {
		return err
	}
	if !w.vfio {
		w.vfio = true
		return w.miscDevice("vfio", "vfio/vfio", nodefs.VFIOMiscMinor)
	}
	return nil
}

// miscDevice writes /sys/class/misc/<name>/dev and /dev/<path>.
func (w *treeWriter) miscDevice(name, path string, minor int) error {
	if err := writeFilesIn(filepath.Join(w.sysfs, "class", "misc", name), map[string]string{"dev": fmt.Sprintf("%d:%d", nodefs.MiscMajor, minor)}); err != nil {
		return err
	}
	return w.dev.Node(path, nodefs.MiscMajor, uint32(minor))
}

// writeFilesIn is writeFiles that creates the directory first.
func writeFilesIn(dir string, files map[string]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return writeFiles(dir, files)
}

// classLink makes /sys/class/<class>/<name> point at dir.
func (w *treeWriter) classLink(class, name, dir string) error {
	return classLink(w.sysfs, class, name, dir)
}

func classLink(sysfs, class, name, dir string) error {
	classDir := filepath.Join(sysfs, "class", class)
	if err := os.MkdirAll(classDir, 0o755); err != nil {
		return err
	}
	rel, err := filepath.Rel(classDir, dir)
	if err != nil {
		return err
	}
	return os.Symlink(rel, filepath.Join(classDir, name))
}

func writeFiles(dir string, files map[string]string) error {
	for name, value := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(value+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}
