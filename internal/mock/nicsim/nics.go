// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package nicsim simulates a node's SR-IOV NICs: PFs and VFs in a fake
// sysfs tree as the kernel lays them out (netdevs, RDMA devices, IOMMU
// groups, VFIO nodes), link state, a VF configurator that refuses what the
// drivers refuse and records every call, the RDMA namespace mode, and, as
// root, veth stand-ins for the netdevs that follow the agent's moves
// between network namespaces. It reports every change to a
// persist.Reporter.
package nicsim

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/model"
	"github.com/hwdra/hwdra/internal/mock/nodefs"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/mock/profile"
)

// VethEnv makes Build create veth stand-ins for the NIC netdevs (root
// only): "1" puts them in the process's own network namespace, where the
// agent finds the host's netdevs; a path puts them in the network
// namespace at that path (tests use a throwaway one, see NewNetns). Plain
// tests leave it unset and stay fast.
const VethEnv = "HWDRA_MOCK_VETH"

// NICs is a mock node's NIC side: the PFs and VFs Build wrote to the fake
// sysfs tree, and the stand-ins for what the sriov backend asks netlink
// (default routes, devlink eswitch mode, VF settings).
type NICs struct {
	sysfs    string
	pfs      []*mockPF
	recorder *VFRecorder
	rdma     *RDMARecorder
	rep      persist.Reporter

	// persistent: the hardware outlives the process (persist.DirEnv),
	// and so do the veth stand-ins.
	persistent bool

	mu    sync.Mutex
	veths *vethSet // nil until EnableVeths
}

// Build creates the NICs of a profile in the sysfs tree at sysfs, their
// device nodes in dev and, with VethEnv, as root, veth stand-ins for
// their netdevs (see EnableVeths), which a persistent node keeps at Close.
// rep is told of every change (persist.Discard: none). A profile without
// NICs gives a node without any.
func Build(p profile.Profile, sysfs string, dev *nodefs.Dev, persistent bool, rep persist.Reporter) (*NICs, error) {
	n := &NICs{sysfs: sysfs, recorder: newVFRecorder(nil, rep), rdma: newRDMARecorder(nil, false), rep: rep, persistent: persistent}
	if len(p.NICs) == 0 {
		return n, nil
	}
	if err := n.build(p.NICs, p.RDMANetns == profile.RDMANetnsExclusive, dev); err != nil {
		return nil, err
	}
	var err error
	switch env := os.Getenv(VethEnv); {
	case env == "1":
		err = n.EnableVeths("")
	case strings.HasPrefix(env, "/"):
		err = n.EnableVeths(env)
	case env != "":
		err = fmt.Errorf("%s=%q: want 1 (this process's network namespace) or a namespace path", VethEnv, env)
	}
	if err != nil {
		return nil, err
	}
	return n, nil
}

// Close removes what Build created outside the sysfs tree: the veth
// stand-ins, unless persistent. A nil NICs has nothing to close.
func (n *NICs) Close() error {
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.veths == nil {
		return nil
	}
	err := n.veths.close()
	n.veths = nil
	return err
}

// Netdevs are the PFs' netdevs in the profile's order of groups and PFs.
func (n *NICs) Netdevs() []string {
	var out []string
	for _, pf := range n.pfs {
		out = append(out, pf.netdev)
	}
	return out
}

type mockPF struct {
	model        model.NIC
	addr         pciAddr
	root, bridge string
	netdev       string
	numa         int
	speedMbps    int // configured speed, reported only while the link is up
	linkUp       bool
	linkType     hw.LinkType
	mtu          int
	rdma         bool
	eswitch      string
	noMinRate    bool // the driver refuses VF minimum rates
	defaultRoute bool
	totalVFs     int
	vfDriver     string // "" for unbound
	vfs          []*mockVF
}

type mockVF struct {
	index  int
	addr   pciAddr
	netdev string // "" unless bound to a netdev driver
	mac    string
}

// pciAddr is a PCI function address; rid is bus<<8 | device<<3 | function.
type pciAddr struct {
	domain int
	rid    int
}

func parsePCIAddr(s string) (pciAddr, error) {
	var dom, bus, dev, fn int
	if _, err := fmt.Sscanf(s, "%04x:%02x:%02x.%1x", &dom, &bus, &dev, &fn); err != nil {
		return pciAddr{}, fmt.Errorf("bad PCI address %q", s)
	}
	return pciAddr{domain: dom, rid: bus<<8 | dev<<3 | fn}, nil
}

func (a pciAddr) bus() int { return a.rid >> 8 }
func (a pciAddr) dev() int { return a.rid >> 3 & 0x1f }
func (a pciAddr) fn() int  { return a.rid & 7 }
func (a pciAddr) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.domain, a.bus(), a.dev(), a.fn())
}

// vfAddr: VF i of a PF follows the PF's device on its bus; each function
// of a multi-port card gets its own range of totalVFs routing IDs, as
// sriov_offset/sriov_stride do on hardware.
func (pf *mockPF) vfAddr(i int) pciAddr {
	return pciAddr{domain: pf.addr.domain, rid: pf.vfOffset() + i}
}

func (pf *mockPF) vfOffset() int {
	return (pf.addr.rid | 7) + 1 + pf.addr.fn()*pf.totalVFs
}

// build lays out every PF and VF and writes them to the sysfs tree.
func (n *NICs) build(groups []profile.NICGroup, exclusive bool, dev *nodefs.Dev) error {
	used, err := usedBuses(n.sysfs)
	if err != nil {
		return err
	}
	for _, g := range groups {
		for _, a := range g.PCIAddresses {
			used[a[:7]] = true
		}
	}
	nextBus := firstFreeBus
	held := owners{}
	for gi, g := range groups {
		m, _ := model.LookupNIC(g.Model) // validated with the profile
		for i := range g.Count {
			pf, err := newMockPF(g, m, i, used, &nextBus)
			if err == nil {
				err = held.claimPF(pf, fmt.Sprintf("nics[%d] PF %d (%s)", gi, i, pf.addr))
			}
			if err != nil {
				return fmt.Errorf("nics[%d]: %w", gi, err)
			}
			n.pfs = append(n.pfs, pf)
		}
	}
	w := &treeWriter{sysfs: n.sysfs, ifindex: 10, iommuGroup: firstNICIOMMUGroup, dev: dev}
	for _, pf := range n.pfs {
		if err := w.writePF(pf); err != nil {
			return fmt.Errorf("NIC %s: %w", pf.addr, err)
		}
	}
	// RDMA devices and VFs are numbered after all PFs, as at boot.
	for _, pf := range n.pfs {
		for _, vf := range pf.vfs {
			if err := w.writeVF(pf, vf); err != nil {
				return fmt.Errorf("VF %d of NIC %s: %w", vf.index, pf.addr, err)
			}
		}
	}
	n.recorder = newVFRecorder(n.pfs, n.rep)
	n.rdma = newRDMARecorder(w.rdmaNames, exclusive)
	return nil
}

// owners records who in the profile holds each PF address and netdev
// name, so that a clash is refused naming both holders rather than as a
// sysfs error.
type owners map[string]string

func (o owners) claim(kind, name, owner, why string) error {
	key := kind + " " + name
	if prev, dup := o[key]; dup {
		return fmt.Errorf("%s %q of %s is also the %s of %s: %s", kind, name, owner, kind, prev, why)
	}
	o[key] = owner
	return nil
}

// claimPF records pf's address and the netdev names of pf and its VFs;
// who is pf in the profile's terms.
func (o owners) claimPF(pf *mockPF, who string) error {
	if err := o.claim("PCI address", pf.addr.String(), who, "a PF's address must be unique"); err != nil {
		return err
	}
	const why = "netdev names must be unique on a node (a VF's is its PF's plus v<index>)"
	if err := o.claim("netdev", pf.netdev, who, why); err != nil {
		return err
	}
	for _, vf := range pf.vfs {
		if vf.netdev == "" {
			continue
		}
		if err := o.claim("netdev", vf.netdev, fmt.Sprintf("VF %d of %s", vf.index, who), why); err != nil {
			return err
		}
	}
	return nil
}

// PFs without pciAddresses get the free buses from firstFreeBus to ff.
const firstFreeBus = 0x30

func newMockPF(g profile.NICGroup, m model.NIC, i int, used map[string]bool, nextBus *int) (*mockPF, error) {
	pf := &mockPF{
		model: m, numa: 0, speedMbps: m.SpeedMbps, linkUp: true, linkType: hw.LinkEthernet,
		rdma: m.RDMA, eswitch: m.Eswitch, totalVFs: g.SriovTotalVFs(m), vfDriver: m.VFDriver,
		defaultRoute: g.DefaultRoute != nil && *g.DefaultRoute == i,
	}
	if len(g.PCIAddresses) > 0 {
		a, err := parsePCIAddr(g.PCIAddresses[i])
		if err != nil {
			return nil, err
		}
		pf.addr = a
	} else {
		for ; used[fmt.Sprintf("0000:%02x", *nextBus)]; *nextBus++ {
		}
		if *nextBus > 0xff {
			return nil, fmt.Errorf("count: no free PCI bus left for PF %d: PFs without pciAddresses get the buses %02x to ff that no GPU or other PF uses (give pciAddresses, several functions of one bus, for more)", i, firstFreeBus)
		}
		used[fmt.Sprintf("0000:%02x", *nextBus)] = true
		pf.addr = pciAddr{rid: *nextBus << 8}
	}
	if pf.vfOffset()+pf.totalVFs-1 > 0xffff {
		return nil, fmt.Errorf("PF %s: its %d VFs do not fit after it", pf.addr, pf.totalVFs)
	}
	pf.root, pf.bridge = pcieRoot(pf.addr, g.PCIeRoots, i)
	if len(g.NUMANodes) > 0 {
		pf.numa = g.NUMANodes[i]
	}
	if g.SpeedMbps > 0 {
		pf.speedMbps = g.SpeedMbps
	}
	if g.LinkUp != nil {
		pf.linkUp = *g.LinkUp
	}
	if g.LinkType != "" {
		pf.linkType = g.LinkType
	}
	pf.mtu = 1500
	if pf.linkType == hw.LinkInfiniBand {
		pf.mtu = 4092 // IPoIB datagram mode with 4K IB MTU
	}
	if g.MTU > 0 {
		pf.mtu = g.MTU
	}
	if g.RDMA != nil {
		pf.rdma = *g.RDMA
	}
	if g.EswitchMode != "" {
		pf.eswitch = g.EswitchMode
	}
	pf.noMinRate = g.VFMinTxRate != nil && !*g.VFMinTxRate
	switch g.VFDriver {
	case "none":
		pf.vfDriver = ""
	case "":
	default:
		pf.vfDriver = g.VFDriver
	}
	pf.netdev = defaultNetdev(pf)
	if len(g.Netdevs) > 0 {
		pf.netdev = g.Netdevs[i]
	}
	for v := range g.VFs {
		vf := &mockVF{index: v, addr: pf.vfAddr(v), mac: vfMAC(pf, v)}
		if pf.vfDriver == m.VFDriver {
			vf.netdev = pf.netdev + "v" + strconv.Itoa(v)
		}
		pf.vfs = append(pf.vfs, vf)
	}
	return pf, nil
}

// pcieRoot: a given root, or the bus above the PF; the PF then sits behind
// one root port (bridge) unless it is on the root bus itself.
func pcieRoot(a pciAddr, roots []string, i int) (root, bridge string) {
	rootBus := max(a.bus()-1, 0)
	root = fmt.Sprintf("pci%04x:%02x", a.domain, rootBus)
	if len(roots) > 0 {
		root = roots[i]
		b, _ := strconv.ParseUint(root[len(root)-2:], 16, 8)
		rootBus = int(b)
	}
	if rootBus == a.bus() {
		return root, ""
	}
	return root, fmt.Sprintf("%s:%02x:01.0", strings.TrimPrefix(root[:7], "pci"), rootBus)
}

// defaultNetdev follows systemd's path-based names: enp24s0f0, ibp24s0f0.
func defaultNetdev(pf *mockPF) string {
	prefix := "enp"
	if pf.linkType == hw.LinkInfiniBand {
		prefix = "ibp"
	}
	return fmt.Sprintf("%s%ds%df%d", prefix, pf.addr.bus(), pf.addr.dev(), pf.addr.fn())
}

func pfMAC(pf *mockPF) string {
	return fmt.Sprintf("%s:%02x:%02x:%02x", pf.model.MACPrefix, pf.addr.domain&0xff, pf.addr.bus(), pf.addr.rid&0xff)
}

// vfMAC is locally administered, unique per VF.
func vfMAC(pf *mockPF, i int) string {
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", pf.addr.domain&0xff, pf.addr.bus(), pf.addr.rid&0xff, i>>8, i&0xff)
}

// usedBuses lists the "<domain>:<bus>" prefixes already in the tree (the
// GPUs are built first), so default NIC addresses never collide with them.
func usedBuses(sysfs string) (map[string]bool, error) {
	used := map[string]bool{}
	entries, err := os.ReadDir(filepath.Join(sysfs, "bus", "pci", "devices"))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, e := range entries {
		if len(e.Name()) >= 7 {
			used[e.Name()[:7]] = true
		}
	}
	return used, nil
}

// DefaultRouteNetdevs reports the PFs a profile marks with defaultRoute
// (satisfies sriov.RouteSource).
func (n *NICs) DefaultRouteNetdevs() ([]string, error) {
	var names []string
	for _, pf := range n.pfs {
		if pf.defaultRoute {
			names = append(names, pf.netdev)
		}
	}
	return names, nil
}

// EswitchMode answers like devlink (satisfies sriov.EswitchSource): ENODEV
// for a device without devlink.
func (n *NICs) EswitchMode(pciAddress string) (string, error) {
	for _, pf := range n.pfs {
		if pf.addr.String() == pciAddress && pf.eswitch != "none" {
			return pf.eswitch, nil
		}
	}
	return "", unix.ENODEV
}

// RDMA moves this node's RDMA devices between namespaces (hw.RDMANetns).
func (n *NICs) RDMA() *RDMARecorder { return n.rdma }

// VFConfigurator is the recording VF configurator of this node.
func (n *NICs) VFConfigurator() *VFRecorder { return n.recorder }
