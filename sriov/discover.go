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

	"github.com/hwdra/hwdra/hw"
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

	var (
		pfs      []hw.PF
		problems []error
	)
	for _, e := range entries { // ReadDir sorts by name, i.e. by address
		d := newDevice(opts.SysfsRoot, e.Name())
		if !isSRIOVNetworkPF(d, &problems) {
			continue
		}
		pf, err := readPF(d, opts.Eswitch, &problems)
		if err != nil {
			problems = append(problems, err)
			continue
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

// readPF reads one PF. Identity and VF counts are required (an error leaves
// the PF out); everything else degrades to "unknown" and, where that is
// not a normal state, a problem.
func readPF(d device, eswitch EswitchSource, problems *[]error) (hw.PF, error) {
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
	pf.Driver = readDriver(d, problems)
	pf.NUMANode = readNUMANode(d, problems)
	if attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(d.address, deviceattribute.WithFSFromRoot(d.root)); err == nil {
		pf.PCIeRoot = *attr.Value.StringValue
	} else {
		*problems = append(*problems, d.err("PCIe root", err))
	}
	entries, err := d.list(".")
	if err != nil {
		return pf, err
	}
	if pf.RDMADevice, err = rdmaDevice(d, entries); err != nil {
		*problems = append(*problems, err)
	}
	if mode, err := eswitch.EswitchMode(d.address); err == nil && mode != "unknown" {
		// Best effort: most drivers (and kernels without devlink) have none.
		pf.EswitchMode = mode
	}

	netdevs, err := d.list("net")
	if err != nil {
		*problems = append(*problems, err)
	}
	if pf.Netdev = uplink(d, netdevs); pf.Netdev != "" {
		readNetdev(d, &pf, problems)
	}
	pf.VFs = readVFs(d, entries, problems)
	return pf, nil
}

func readDriver(d device, problems *[]error) string {
	drv, err := d.linkTarget("driver")
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

// rdmaDevice finds the RDMA device of a PCI function. Kernels before 5.11
// put it in <dev>/infiniband/<name>; since mlx5 and ice moved to the
// auxiliary bus it sits one level down, under the auxiliary device
// (<dev>/mlx5_core.rdma.0/infiniband/mlx5_0, <dev>/ice.roce.0/...).
func rdmaDevice(d device, entries []string) (string, error) {
	for _, e := range entries {
		if e != "infiniband" && strings.Count(e, ".") != 2 { // aux devices: <module>.<name>.<id>
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

// uplink picks the PF's own netdev among those under <dev>/net. In legacy
// mode there is one. In switchdev mode the VF representors (phys_port_name
// "pf0vf3") sit there too and the uplink's phys_port_name is "p0".
func uplink(d device, netdevs []string) string {
	if len(netdevs) <= 1 {
		return first(netdevs)
	}
	sort.Strings(netdevs)
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
func readVFs(d device, names []string, problems *[]error) []hw.VF {
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
		addr, err := d.linkTarget(name)
		if err != nil {
			*problems = append(*problems, err)
			continue
		}
		vfs = append(vfs, readVF(newDevice(d.root, addr), index, problems))
	}
	sort.Slice(vfs, func(i, j int) bool { return vfs[i].Index < vfs[j].Index })
	return vfs
}

// readVF reads what is known of a VF; all of it is optional. A VF bound to
// vfio-pci (or to no driver) has no netdev, so no MAC or MTU.
func readVF(d device, index int, problems *[]error) hw.VF {
	vf := hw.VF{Index: index, PCIAddress: d.address}
	vf.Driver = readDriver(d, problems)
	if id, err := d.readHexID("device"); err == nil {
		vf.DeviceID = id
	} else if !isNotExist(err) {
		*problems = append(*problems, err)
	}
	netdevs, err := d.list("net")
	if err != nil {
		*problems = append(*problems, err)
	}
	if vf.Netdev = first(netdevs); vf.Netdev != "" {
		dir := filepath.Join("net", vf.Netdev)
		vf.MAC, _ = d.read(filepath.Join(dir, "address"))
		vf.MTU, _ = d.readInt(filepath.Join(dir, "mtu"))
	}
	entries, err := d.list(".")
	if err != nil {
		*problems = append(*problems, err)
	}
	if vf.RDMADevice, err = rdmaDevice(d, entries); err != nil {
		*problems = append(*problems, err)
	}
	return vf
}
