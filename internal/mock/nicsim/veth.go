// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nicsim

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/hw"
)

// vethSet holds the veth stand-ins of a mock node's netdevs: one veth pair
// per PF and VF netdev, in the network namespace where the host's netdevs
// are (the agent's own, or a test's stand-in for it), so that the agent
// moves real links. The stand-in is named like the netdev; its peer
// (hwp<pf> for a PF, hwp<pf>v<vf> for a VF) stays in that namespace and
// gives the stand-in its carrier.
//
// Like the kernel's sysfs, the mock's lists a netdev only while it is in
// that namespace, under its current name: a watch on the namespace's link
// events keeps the tree in step when the agent moves a VF stand-in into a
// pod, renames it or brings it back. A physical VF whose pod namespace is
// destroyed returns to the host (named dev<ifindex> by the kernel when its
// pod name is taken; the mock always names it so); a veth is destroyed
// with the namespace, so the mock recreates it there, down, with the VF's
// MAC and MTU.
type vethSet struct {
	path   string // the namespace's path; "" for the process's own
	ns     netns.NsHandle
	handle *netlink.Handle
	// keep: a persistent mock (persist.DirEnv) leaves the links at Close, as
	// hardware outlives the agent.
	keep bool
	nics *NICs
	vfs  []*vethVF
	// peers: each PF stand-in's peer, whose state is the PF's carrier.
	peers map[string]string

	mu      sync.Mutex // serialises refresh
	done    chan struct{}
	stopped chan struct{} // nil until the watch runs
}

// vethVF is one VF's stand-in.
type vethVF struct {
	pf   *mockPF
	vf   *mockVF
	peer string
	// name is the stand-in's name in the namespace, "" while it is
	// elsewhere; index its ifindex when last seen.
	name  string
	index int
}

func pfPeer(i int) string       { return "hwp" + strconv.Itoa(i) }
func vfPeer(i, v int) string    { return pfPeer(i) + "v" + strconv.Itoa(v) }
func returnedName(i int) string { return "dev" + strconv.Itoa(i) }

// EnableVeths creates the veth stand-ins in the network namespace at path
// ("" for the process's own). A PF whose link is down gets its peer left
// down, so it has no carrier; VF stand-ins start down. Links left there by
// an earlier process on the same persistent mock directory are taken
// over as they are; other links of the same names are replaced. Needs
// root; Close deletes the links (a persistent mock keeps them).
func (n *NICs) EnableVeths(path string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.veths != nil {
		return nil
	}
	if os.Geteuid() != 0 {
		return errors.New("mock: veth stand-ins for NIC netdevs need root")
	}
	v := &vethSet{path: path, keep: n.persistent, nics: n, done: make(chan struct{}), peers: map[string]string{}}
	var err error
	if path == "" {
		v.ns, err = netns.Get()
	} else {
		v.ns, err = netns.GetFromPath(path)
	}
	if err != nil {
		return fmt.Errorf("mock: network namespace %q for veth stand-ins: %w", path, err)
	}
	if v.handle, err = netlink.NewHandleAt(v.ns, unix.NETLINK_ROUTE); err != nil {
		v.ns.Close()
		return fmt.Errorf("mock: netlink in %q: %w", path, err)
	}
	if err := v.create(n.pfs); err != nil {
		return errors.Join(err, v.close())
	}
	if err := v.refresh(); err != nil {
		return errors.Join(err, v.close())
	}
	if err := v.watch(); err != nil {
		return errors.Join(err, v.close())
	}
	n.veths = v
	n.rdma.setHome(path)
	n.recorder.mu.Lock()
	n.recorder.netdev = v.apply
	n.recorder.mu.Unlock()
	return nil
}

// create makes (or, on a persistent mock, takes over) every pair.
func (v *vethSet) create(pfs []*mockPF) error {
	for i, pf := range pfs {
		mac := pfMAC(pf)
		if pf.linkType == hw.LinkInfiniBand {
			mac = "" // 20-byte IPoIB addresses do not fit a veth
		}
		if err := v.pair(pf.netdev, pfPeer(i), mac, pf.mtu, true, pf.linkUp); err != nil {
			return err
		}
		v.peers[pf.netdev] = pfPeer(i)
		for _, vf := range pf.vfs {
			if vf.netdev == "" {
				continue
			}
			// The tree lists it under its boot name until refresh finds it.
			s := &vethVF{pf: pf, vf: vf, peer: vfPeer(i, vf.index), name: vf.netdev}
			v.vfs = append(v.vfs, s)
			if err := v.pair(vf.netdev, s.peer, vf.mac, pf.mtu, false, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// pair creates the stand-in name with its peer, unless a persistent mock
// finds the peer there already (the stand-in is wherever the last process
// left it).
func (v *vethSet) pair(name, peer, mac string, mtu int, up, carrier bool) error {
	if _, err := v.handle.LinkByName(peer); err == nil {
		if v.keep {
			return nil
		}
		if err := v.delete(peer); err != nil {
			return err
		}
	}
	if l, err := v.handle.LinkByName(name); err == nil {
		if err := v.handle.LinkDel(l); err != nil {
			return fmt.Errorf("mock: replacing %s: %w", name, err)
		}
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.MTU = name, mtu
	if hwa, err := net.ParseMAC(mac); err == nil && len(hwa) == 6 {
		la.HardwareAddr = hwa
	}
	veth := &netlink.Veth{LinkAttrs: la, PeerName: peer}
	if err := v.handle.LinkAdd(veth); err != nil {
		return fmt.Errorf("mock: veth %s: %w", name, err)
	}
	if carrier {
		if err := v.setUp(peer, true); err != nil {
			return err
		}
	}
	return v.setUp(name, up)
}

// watch refreshes the tree on every link event of the namespace until
// close; events arriving during a refresh are folded into the next one.
func (v *vethSet) watch() error {
	updates := make(chan netlink.LinkUpdate, 256)
	subDone := make(chan struct{})
	err := netlink.LinkSubscribeWithOptions(updates, subDone, netlink.LinkSubscribeOptions{
		Namespace: &v.ns,
		ErrorCallback: func(err error) {
			select {
			case <-v.done: // the socket closes with the watch
			default:
				fmt.Fprintf(os.Stderr, "mock: watching links of the veth stand-ins: %v\n", err)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("mock: watching links in %q: %w", v.path, err)
	}
	v.stopped = make(chan struct{})
	go func() {
		defer close(v.stopped)
		defer close(subDone)
		for {
			select {
			case <-v.done:
				return
			case _, ok := <-updates:
				if !ok {
					return
				}
			}
			for drained := false; !drained; {
				select {
				case <-updates:
				default:
					drained = true
				}
			}
			if err := v.refresh(); err != nil {
				fmt.Fprintf(os.Stderr, "mock: %v\n", err)
			}
		}
	}()
	return nil
}

// refresh brings the sysfs tree and the VF recorder in line with where
// each VF stand-in is, and recreates the stand-ins that were destroyed.
func (v *vethSet) refresh() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	select {
	case <-v.done:
		return nil
	default:
	}
	links, err := v.handle.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("listing links: %w", err)
	}
	byName := map[string]netlink.Link{}
	byIndex := map[int]netlink.Link{}
	for _, l := range links {
		byName[l.Attrs().Name] = l
		byIndex[l.Attrs().Index] = l
	}
	var errs []error
	for _, s := range v.vfs {
		name := ""
		if peer, ok := byName[s.peer]; !ok {
			// Destroyed with a pod's namespace: a VF would return.
			if name, err = v.recreate(s, byName); err != nil {
				errs = append(errs, err)
				continue
			}
		} else if a := peer.Attrs(); a.NetNsID < 0 {
			// A veth's IFLA_LINK is its peer's ifindex, and the link
			// netnsid is set only when the peer is in another namespace.
			if l, ok := byIndex[a.ParentIndex]; ok {
				name, s.index = l.Attrs().Name, a.ParentIndex
			}
		}
		if name == s.name {
			continue
		}
		if err := v.moved(s, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// recreate makes a destroyed VF stand-in again, as the VF would come back:
// named dev<its last ifindex>, down, with its MAC and MTU.
func (v *vethSet) recreate(s *vethVF, byName map[string]netlink.Link) (string, error) {
	cfg := v.nics.recorder.vfConfig(s.pf.netdev, s.vf.index)
	mac := s.vf.mac
	if cfg.MAC != "" && cfg.MAC != "00:00:00:00:00:00" {
		mac = cfg.MAC
	}
	mtu := cfg.MTU
	if mtu == 0 {
		mtu = s.pf.mtu
	}
	name := returnedName(s.index)
	for i := 1000; s.index == 0 || byName[name] != nil; i++ {
		// Not seen yet, or the name is taken: the kernel's dev%d.
		name, s.index = returnedName(i), i
	}
	if err := v.pair(name, s.peer, mac, mtu, false, true); err != nil {
		return "", err
	}
	return name, nil
}

// moved records that a VF stand-in is now called name in the namespace
// ("" when it left): its sysfs entries and the recorder follow.
func (v *vethSet) moved(s *vethVF, name string) error {
	sysfs := v.nics.sysfs
	dev := vfDeviceDir(sysfs, s.vf.addr.String())
	// The recorder first: whoever sees sysfs change finds the recorder
	// agreeing (a test that waits for the sysfs entry to go, then asks
	// GetVF by the old name, must get ENODEV).
	old := s.name
	s.name = name
	v.nics.recorder.rename(s.pf.netdev, s.vf.index, name)
	if old != "" {
		if err := removeNetdev(sysfs, dev, old); err != nil {
			return err
		}
	}
	if name == "" {
		return nil
	}
	if _, err := os.Stat(dev); errors.Is(err, fs.ErrNotExist) {
		// The VF was unplugged (a test removed its device): writing its
		// netdev would bring the device's directory back, and with it a
		// VF that the kernel no longer has.
		return nil
	}
	l, err := v.handle.LinkByName(name)
	if err != nil {
		return fmt.Errorf("VF stand-in %s: %w", name, err)
	}
	a := l.Attrs()
	nd := netdev{name: name, mtu: a.MTU, linkType: s.pf.linkType, up: a.Flags&net.FlagUp != 0}
	if len(a.HardwareAddr) > 0 {
		nd.mac = a.HardwareAddr.String()
	}
	return writeNetdevFiles(sysfs, dev, nd, a.Index)
}

// Netns is the path of the network namespace holding the veth stand-ins,
// as given to EnableVeths ("" for the process's own, or without them).
func (n *NICs) Netns() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.veths == nil {
		return ""
	}
	return n.veths.path
}

// Settle brings the sysfs tree and the VF recorder in line with the links
// now, as the kernel's sysfs always is; without it they follow link
// events a moment later. A no-op without veth stand-ins.
func (n *NICs) Settle() {
	n.mu.Lock()
	v := n.veths
	n.mu.Unlock()
	if v == nil {
		return
	}
	if err := v.refresh(); err != nil {
		fmt.Fprintf(os.Stderr, "mock: %v\n", err)
	}
}

// HasVeths reports whether the netdevs have veth stand-ins.
func (n *NICs) HasVeths() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.veths != nil
}

func (v *vethSet) setUp(name string, up bool) error {
	l, err := v.handle.LinkByName(name)
	if err != nil {
		return fmt.Errorf("mock: %s: %w", name, err)
	}
	if up {
		err = v.handle.LinkSetUp(l)
	} else {
		err = v.handle.LinkSetDown(l)
	}
	if err != nil {
		return fmt.Errorf("mock: %s: %w", name, err)
	}
	return nil
}

// apply sets MTU (if non-zero) or link state (if non-nil) of a stand-in.
func (v *vethSet) apply(name string, mtu int, up *bool) error {
	if up != nil {
		return v.setUp(name, *up)
	}
	l, err := v.handle.LinkByName(name)
	if err != nil {
		return err
	}
	return v.handle.LinkSetMTU(l, mtu)
}

// delete removes a link, and with a veth end its peer, wherever that is.
func (v *vethSet) delete(name string) error {
	l, err := v.handle.LinkByName(name)
	if err != nil {
		return nil //nolint:nilerr // already gone: nothing to delete
	}
	// A pair whose other end is in a pod's namespace goes with that
	// namespace, which the kernel tears down in the background: the link
	// can vanish between the lookup and the delete.
	if err := v.handle.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("mock: deleting %s: %w", name, err)
	}
	return nil
}

// close stops the watch and, unless the mock is persistent, deletes the
// pairs through their peers (which takes the stand-ins in pods too).
func (v *vethSet) close() error {
	v.mu.Lock()
	select {
	case <-v.done:
	default:
		close(v.done)
	}
	v.mu.Unlock()
	if v.stopped != nil {
		<-v.stopped
	}
	var errs []error
	if !v.keep && v.handle != nil {
		for i, pf := range v.nics.pfs {
			errs = append(errs, v.delete(pfPeer(i)))
			for _, vf := range pf.vfs {
				if vf.netdev != "" {
					errs = append(errs, v.delete(vfPeer(i, vf.index)))
				}
			}
		}
	}
	if v.handle != nil {
		v.handle.Close()
	}
	errs = append(errs, v.ns.Close())
	return errors.Join(errs...)
}
