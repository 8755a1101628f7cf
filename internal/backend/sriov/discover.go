// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/hwdra/hwdra/internal/hw"
)

// DefaultSysfsRoot is where the kernel mounts sysfs.
const DefaultSysfsRoot = "/sys"

// Options configures Discover. The zero value reads /sys and asks netlink
// in the current network namespace.
type Options struct {
	// SysfsRoot is the sysfs mount ("/sys"); tests and the mock use a fake
	// tree.
	SysfsRoot string
	// Routes tells which netdevs carry a default route. Nil: NetlinkRoutes.
	Routes RouteSource
	// Eswitch reports devlink eswitch modes. Nil: Devlink.
	Eswitch EswitchSource
}

// Discover returns every SR-IOV capable network PF, sorted by PCI address,
// with its VFs sorted by index.
//
// A problem confined to one device (an unreadable file, a dangling link)
// does not hide the others: that PF or VF is left out, or a field it
// concerns left empty, and the problem is reported in the returned error
// (errors.Join of *DeviceError) alongside the PFs that were read. The
// error is fatal, with no PFs, only when the PCI bus or the routes cannot
// be read at all.
func Discover(opts Options) ([]hw.PF, error) {
	if opts.SysfsRoot == "" {
		opts.SysfsRoot = DefaultSysfsRoot
	}
	if opts.Routes == nil {
		opts.Routes = NetlinkRoutes{}
	}
	if opts.Eswitch == nil {
		opts.Eswitch = Devlink{}
	}
	entries, err := os.ReadDir(filepath.Join(opts.SysfsRoot, "bus", "pci", "devices"))
	if err != nil {
		return nil, fmt.Errorf("sriov: listing PCI devices: %w", err)
	}
	// Without knowing the default route, the management NIC could be
	// offered and handed to a pod: refuse rather than guess.
	routed, err := opts.Routes.DefaultRouteNetdevs()
	if err != nil {
		return nil, fmt.Errorf("sriov: listing default routes: %w", err)
	}
	defaultRoute := make(map[string]bool, len(routed))
	for _, n := range routed {
		defaultRoute[n] = true
	}

	var sc scan
	if sc.netdevs, err = scanClass(opts.SysfsRoot, "net"); err != nil {
		return nil, fmt.Errorf("sriov: listing netdevs: %w", err)
	}
	sc.eswitch = opts.Eswitch

	var (
		pfs      []hw.PF
		problems []error
		vfs      = map[string]bool{} // VFs seen: no need to look at them again
	)
	for _, e := range entries { // ReadDir sorts by name, i.e. by address
		// A VF's address follows its PF's (routing ID = PF's + offset), so
		// the PF has been read and the VF skipped without a syscall.
		if vfs[e.Name()] {
			continue
		}
		d := newDevice(opts.SysfsRoot, e.Name())
		if !isSRIOVNetworkPF(d, &problems) {
			continue
		}
		pf, err := sc.readPF(d.resolved(), &problems)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		for _, vf := range pf.VFs {
			vfs[vf.PCIAddress] = true
		}
		pf.DefaultRoute = pf.Netdev != "" && defaultRoute[pf.Netdev]
		pfs = append(pfs, pf)
	}
	sort.Slice(pfs, func(i, j int) bool { return pfs[i].PCIAddress < pfs[j].PCIAddress })
	return pfs, errors.Join(problems...)
}

// isSRIOVNetworkPF: the device has sriov_totalvfs and is a network
// controller. The class check matters: NVIDIA GPUs (A100, H100) and NVMe
// drives expose sriov_totalvfs too.
func isSRIOVNetworkPF(d device, problems *[]error) bool {
	if !d.exists("sriov_totalvfs") {
		return false
	}
	class, err := d.read("class")
	if err != nil {
		*problems = append(*problems, err)
		return false
	}
	return strings.HasPrefix(strings.ToLower(class), "0x02")
}

// scan is what one Discover call reads once for all devices.
type scan struct {
	netdevs classIndex
	eswitch EswitchSource
}

// readPF reads one PF. Identity and VF counts are required (an error leaves
// the PF out); everything else degrades to "unknown" and, where that is
// not a normal state, a problem.
func (sc scan) readPF(d device, problems *[]error) (hw.PF, error) {
	pf := hw.PF{PCIAddress: d.address, NUMANode: hw.UnknownNUMANode}
	var err error
	if pf.VendorID, err = d.readHexID("vendor"); err != nil {
		return pf, err
	}
	if pf.DeviceID, err = d.readHexID("device"); err != nil {
		return pf, err
	}
	if pf.TotalVFs, err = d.readInt("sriov_totalvfs"); err != nil {
		return pf, err
	}
	if pf.NumVFs, err = d.readInt("sriov_numvfs"); err != nil {
		return pf, err
	}
	pf.Driver = readDriver(d, true, problems)
	pf.NUMANode = readNUMANode(d, problems)
	if attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(d.address, deviceattribute.WithFSFromRoot(d.root)); err == nil {
		pf.PCIeRoot = *attr.Value.StringValue
	} else {
		*problems = append(*problems, d.err("PCIe root", err))
	}
	if mode, err := sc.eswitch.EswitchMode(d.address); err == nil && mode != "unknown" {
		// Best effort: most drivers (and kernels without devlink) have none.
		pf.EswitchMode = mode
	}
	if pf.Netdev = uplink(d, sc.netdevs[d.address]); pf.Netdev != "" {
		readNetdev(d, &pf, problems)
	}
	entries, err := d.list(".")
	if err != nil {
		return pf, err
	}
	if pf.RDMADevice, err = rdmaDevice(d, entries); err != nil {
		*problems = append(*problems, err)
	}
	// One read for all VFs' device ID where the kernel has sriov_vf_device;
	// else one per VF.
	vfDeviceID, _ := d.readHexID("sriov_vf_device")
	pf.VFs = sc.readVFs(d, entries, vfDeviceID, problems)
	return pf, nil
}

// readDriver returns the bound driver's name, "" when unbound. check also
// stats the link's target, to report a dangling link; VFs skip that (the
// kernel removes the link on unbind) since it costs a syscall per VF.
func readDriver(d device, check bool, problems *[]error) string {
	var (
		drv string
		err error
	)
	if check {
		drv, err = d.linkTarget("driver")
	} else if drv, err = d.readlink("driver"); err == nil {
		drv = filepath.Base(drv)
	}
	if err != nil {
		if !isNotExist(err) {
			*problems = append(*problems, err)
		}
		return "" // unbound
	}
	return drv
}

// readNUMANode: -1 and a missing file both mean unknown (single-socket
// machines and some VMs report -1).
func readNUMANode(d device, problems *[]error) int {
	n, err := d.readInt("numa_node")
	switch {
	case err == nil && n >= 0:
		return n
	case err != nil && !isNotExist(err):
		*problems = append(*problems, err)
	}
	return hw.UnknownNUMANode
}

// RDMADevice returns the RDMA device of a PCI function ("mlx5_3"), "" if
// it has none. Discover fills it for PFs only; prepare asks for the one VF
// it hands out rather than every VF costing a directory listing.
func RDMADevice(sysfsRoot, pciAddress string) (string, error) {
	if sysfsRoot == "" {
		sysfsRoot = DefaultSysfsRoot
	}
	d := newDevice(sysfsRoot, pciAddress)
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return "", d.err(".", unwrapPath(err))
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return rdmaDevice(d, names)
}

// rdmaDevice finds the RDMA device among a function's directory entries.
// Kernels before 5.11 put it in <dev>/infiniband/<name>; since mlx5 and ice
// moved to the auxiliary bus it sits under the auxiliary device
// (<dev>/mlx5_core.rdma.0/infiniband/mlx5_0, <dev>/ice.roce.0/...).
func rdmaDevice(d device, entries []string) (string, error) {
	for _, e := range entries {
		if e != "infiniband" && !isAuxDevice(e) {
			continue
		}
		dir := "infiniband"
		if e != "infiniband" {
			dir = filepath.Join(e, "infiniband")
		}
		names, err := d.list(dir)
		if err != nil || len(names) > 0 {
			return first(names), err
		}
	}
	return "", nil
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

var uplinkPortName = regexp.MustCompile(`^p\d+$`)

// uplink picks the PF's own netdev among those on its PCI function (sorted
// by name). In legacy mode there is one. In switchdev mode the VF
// representors (phys_port_name "pf0vf3") sit there too and the uplink's
// phys_port_name is "p0".
func uplink(d device, netdevs []string) string {
	if len(netdevs) <= 1 {
		return first(netdevs)
	}
	for _, n := range netdevs {
		if name, err := d.read(filepath.Join("net", n, "phys_port_name")); err == nil && uplinkPortName.MatchString(name) {
			return n
		}
	}
	return netdevs[0]
}

// readNetdev fills the PF's link fields from <dev>/net/<if>/.
func readNetdev(d device, pf *hw.PF, problems *[]error) {
	dir := filepath.Join("net", pf.Netdev)
	soft := func(err error) {
		if err != nil && !isNotExist(err) {
			*problems = append(*problems, err)
		}
	}
	var err error
	pf.MAC, err = d.read(filepath.Join(dir, "address"))
	soft(err)
	pf.MTU, err = d.readInt(filepath.Join(dir, "mtu"))
	soft(err)
	if t, err := d.readInt(filepath.Join(dir, "type")); err == nil {
		pf.LinkType = linkType(t)
	} else {
		soft(err)
	}
	pf.LinkUp = linkUp(d, dir)
	if !pf.LinkUp {
		return // speed is meaningless (or EINVAL) while the link is down
	}
	// speed is -1 (or 4294967295 from old drivers) when unknown and EINVAL
	// on read for some drivers; all mean unknown.
	speed, err := d.readInt(filepath.Join(dir, "speed"))
	switch {
	case err == nil && speed > 0 && speed != int(^uint32(0)):
		pf.SpeedMbps = speed
	case err != nil && !isNotExist(err) && !isInvalid(err):
		*problems = append(*problems, err)
	}
}

// ARPHRD_* values of net/<if>/type.
const (
	arphrdEther      = 1
	arphrdInfiniband = 32
)

func linkType(t int) hw.LinkType {
	switch t {
	case arphrdEther:
		return hw.LinkEthernet
	case arphrdInfiniband:
		return hw.LinkInfiniBand
	}
	return ""
}

// linkUp: operstate "up", or "unknown" with carrier (drivers that do not
// report RFC 2863 state). carrier reads EINVAL while admin-down.
func linkUp(d device, dir string) bool {
	state, err := d.read(filepath.Join(dir, "operstate"))
	if err == nil && state == "up" {
		return true
	}
	if err == nil && state != "unknown" {
		return false
	}
	carrier, err := d.readInt(filepath.Join(dir, "carrier"))
	return err == nil && carrier == 1
}

// readVFs reads the virtfn<N> links. A dangling link (a VF going away while
// sriov_numvfs changes) leaves that VF out and is reported.
func (sc scan) readVFs(d device, names []string, vfDeviceID string, problems *[]error) []hw.VF {
	var vfs []hw.VF
	for _, name := range names {
		idx, ok := strings.CutPrefix(name, "virtfn")
		if !ok {
			continue
		}
		index, err := strconv.Atoi(idx)
		if err != nil {
			continue
		}
		target, err := d.readlink(name)
		if err != nil {
			*problems = append(*problems, err)
			continue
		}
		// The VF's real directory: no symlink to walk for each of its files.
		vfDev := device{root: d.root, address: filepath.Base(target), dir: filepath.Join(d.dir, target)}
		vf, err := sc.readVF(vfDev, index, vfDeviceID, problems)
		if isNotExist(err) {
			// The VF's directory is gone, not just one file of it.
			if _, statErr := os.Stat(filepath.Join(d.dir, name)); statErr != nil {
				err = d.err(name, fmt.Errorf("%w to %s: %v", ErrDanglingLink, target, unwrapPath(statErr)))
			}
		}
		if err != nil {
			*problems = append(*problems, err)
			continue
		}
		vfs = append(vfs, vf)
	}
	sort.Slice(vfs, func(i, j int) bool { return vfs[i].Index < vfs[j].Index })
	return vfs
}

// readVF reads what is known of a VF: a handful of syscalls each, since a
// node can have hundreds. A VF bound to vfio-pci (or to no driver) has no
// netdev. A VF whose directory is gone is an error (isNotExist): its
// virtfn link dangles.
func (sc scan) readVF(d device, index int, deviceID string, problems *[]error) (hw.VF, error) {
	vf := hw.VF{Index: index, PCIAddress: d.address, DeviceID: deviceID}
	var err error
	if vf.DeviceID == "" {
		if vf.DeviceID, err = d.readHexID("device"); err != nil {
			return vf, err
		}
	}
	if vf.Driver = readDriver(d, false, problems); vf.Driver == "" {
		// Unbound, or gone: only the directory tells.
		if _, err := os.Stat(d.dir); err != nil {
			return vf, d.err(".", unwrapPath(err))
		}
	}
	vf.Netdev = first(sc.netdevs[d.address])
	return vf, nil
}
