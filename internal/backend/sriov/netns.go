// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"sort"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Netns is an open network namespace with a netlink socket in it: the
// agent's own, where VF netdevs live, or a pod's. Every call goes through
// that socket; no thread switches namespace after OpenNetns.
type Netns struct {
	// Path is the namespace file ("" for the agent's own).
	Path string
	ns   netns.NsHandle
	nl   *netlink.Handle
	// raw serves the requests netlink.Handle has no call for.
	raw map[int]*nl.SocketHandle
	// stepwise makes MoveLink use separate requests (tests: kernels that
	// refuse a rename with the move).
	stepwise bool
}

// ErrNetnsGone is returned for a namespace whose file no longer exists:
// the pod's sandbox was torn down.
var ErrNetnsGone = errors.New("network namespace is gone")

// netlinkTimeout bounds every request: a hook that waits longer than the
// runtime's NRI timeout (2 s in containerd) is dropped.
const netlinkTimeout = 500 * time.Millisecond

// OpenNetns opens the network namespace at path ("" for the calling
// process's own) with a netlink socket in it.
func OpenNetns(path string) (*Netns, error) {
	var (
		ns  netns.NsHandle
		err error
	)
	if path == "" {
		ns, err = netns.Get()
	} else {
		ns, err = netns.GetFromPath(path)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNetnsGone, path)
	}
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %q: %w", path, err)
	}
	n := &Netns{Path: path, ns: ns}
	if n.nl, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE); err != nil {
		ns.Close()
		return nil, fmt.Errorf("netlink in network namespace %q: %w", path, err)
	}
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err == nil {
		tv := unix.NsecToTimeval(netlinkTimeout.Nanoseconds())
		err = errors.Join(s.SetSendTimeout(&tv), s.SetReceiveTimeout(&tv))
	}
	if err == nil {
		err = n.nl.SetSocketTimeout(netlinkTimeout)
	}
	if err != nil {
		if s != nil {
			s.Close()
		}
		n.nl.Close()
		ns.Close()
		return nil, fmt.Errorf("netlink in network namespace %q: %w", path, err)
	}
	n.raw = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}
	return n, nil
}

// Close releases the namespace and its sockets.
func (n *Netns) Close() error {
	n.nl.Close()
	for _, s := range n.raw {
		s.Close()
	}
	return n.ns.Close()
}

// FD is the namespace's file descriptor, valid until Close.
func (n *Netns) FD() int { return int(n.ns) }

// String names the namespace in errors.
func (n *Netns) String() string {
	if n.Path == "" {
		return "the host namespace"
	}
	return "network namespace " + n.Path
}

// LinkState is what the agent changes on a VF netdev and restores.
type LinkState struct {
	Name string `json:"name"`
	MTU  int    `json:"mtu"`
	MAC  string `json:"mac,omitempty"`
	Up   bool   `json:"up"`
	// Addresses in CIDR form, sorted, without IPv6 link-local ones (the
	// kernel makes those itself when the link comes up).
	Addresses []string `json:"addresses,omitempty"`
}

// HasLink reports whether a link of that name is in the namespace.
func (n *Netns) HasLink(name string) (bool, error) {
	_, err := n.nl.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &notFound):
		return false, nil
	}
	return false, fmt.Errorf("%s: link %s: %w", n, name, err)
}

// FindLink returns the first of names that is a link in the namespace,
// "" when none is.
func (n *Netns) FindLink(names ...string) (string, error) {
	for _, name := range names {
		if name == "" {
			continue
		}
		ok, err := n.HasLink(name)
		if err != nil {
			return "", err
		}
		if ok {
			return name, nil
		}
	}
	return "", nil
}

// ReadLink reads a link's restorable state.
func (n *Netns) ReadLink(name string) (LinkState, error) {
	l, err := n.nl.LinkByName(name)
	if err != nil {
		return LinkState{}, fmt.Errorf("%s: link %s: %w", n, name, err)
	}
	return n.readLink(l, name)
}

// ReadLinkAt is ReadLink of the link with that ifindex.
func (n *Netns) ReadLinkAt(index int) (LinkState, error) {
	l, err := n.byIndex(index)
	if err != nil {
		return LinkState{}, err
	}
	return n.readLink(l, l.Attrs().Name)
}

// byIndex is the link with that ifindex, the error naming it.
func (n *Netns) byIndex(index int) (netlink.Link, error) {
	l, err := n.nl.LinkByIndex(index)
	if err != nil {
		return nil, fmt.Errorf("%s: link with ifindex %d: %w", n, index, err)
	}
	return l, nil
}

func (n *Netns) readLink(l netlink.Link, name string) (LinkState, error) {
	a := l.Attrs()
	st := LinkState{Name: a.Name, MTU: a.MTU, Up: a.Flags&net.FlagUp != 0}
	if len(a.HardwareAddr) > 0 {
		st.MAC = a.HardwareAddr.String()
	}
	addrs, err := consistent(func() ([]netlink.Addr, error) { return n.nl.AddrList(l, netlink.FAMILY_ALL) })
	if err != nil {
		return st, fmt.Errorf("%s: addresses of %s: %w", n, name, err)
	}
	for _, ad := range addrs {
		if ad.IP.To4() == nil && ad.IP.IsLinkLocalUnicast() {
			continue
		}
		st.Addresses = append(st.Addresses, ad.IPNet.String())
	}
	sort.Strings(st.Addresses)
	return st, nil
}

// LinkSettings are what MoveLink sets with the move; zero values keep the
// link's own.
type LinkSettings struct {
	Name string
	MTU  int
	MAC  string
}

// MoveLink moves a link of n into dst. Name, MTU and MAC are set in the
// same RTM_SETLINK request: the kernel moves the link (keeping its name,
// or taking the new one if its own is taken over there), then sets MAC,
// MTU and name in the new namespace. A kernel that refuses the combined
// request gets them one by one. A new name already taken in dst fails
// before anything moves. On any other error the link may have moved
// already, under its old or its new name: the kernel does not undo the
// move when a later attribute fails (FindLink looks for both).
func (n *Netns) MoveLink(name string, dst *Netns, set LinkSettings) error {
	l, err := n.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("%s: link %s: %w", n, name, err)
	}
	return n.moveLink(l, dst, set)
}

// MoveLinkAt is MoveLink of the link with that ifindex: in a namespace
// whose links someone else names (a pod's), the link found by identity
// (VFLink) is moved, whatever it is called by then.
func (n *Netns) MoveLinkAt(index int, dst *Netns, set LinkSettings) error {
	l, err := n.byIndex(index)
	if err != nil {
		return err
	}
	return n.moveLink(l, dst, set)
}

func (n *Netns) moveLink(l netlink.Link, dst *Netns, set LinkSettings) error {
	name := l.Attrs().Name
	var err error
	if set.Name != "" && set.Name != name {
		if taken, err := dst.HasLink(set.Name); err != nil || taken {
			return errors.Join(err, n.moveErr(name, dst, fmt.Errorf("name %s is taken there: %w", set.Name, unix.EEXIST)))
		}
	}
	var mac net.HardwareAddr
	if set.MAC != "" {
		if mac, err = net.ParseMAC(set.MAC); err != nil {
			return fmt.Errorf("MAC %q: %w", set.MAC, err)
		}
	}
	if !n.stepwise {
		err := n.setLink(l.Attrs().Index, dst, set.Name, set.MTU, mac)
		if err == nil || !(errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)) {
			return n.moveErr(name, dst, err)
		}
		if _, gone := n.nl.LinkByIndex(l.Attrs().Index); gone != nil {
			return n.moveErr(name, dst, err) // moved, then refused a setting
		}
	}
	// One by one: the move keeps the name (the kernel refuses it when the
	// name is taken there), then rename, MTU and MAC over there.
	if err := n.nl.LinkSetNsFd(l, dst.FD()); err != nil {
		return n.moveErr(name, dst, err)
	}
	moved, err := dst.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("%s: link %s after the move: %w", dst, name, err)
	}
	if set.Name != "" && set.Name != name {
		if err := dst.nl.LinkSetName(moved, set.Name); err != nil {
			return fmt.Errorf("%s: renaming %s to %s: %w", dst, name, set.Name, err)
		}
	}
	if set.MTU > 0 {
		if err := dst.nl.LinkSetMTU(moved, set.MTU); err != nil {
			return fmt.Errorf("%s: MTU %d on %s: %w", dst, set.MTU, set.Name, err)
		}
	}
	if mac != nil {
		if err := dst.nl.LinkSetHardwareAddr(moved, mac); err != nil {
			return fmt.Errorf("%s: MAC %s on %s: %w", dst, set.MAC, set.Name, err)
		}
	}
	return nil
}

func (n *Netns) moveErr(name string, dst *Netns, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("moving %s from %s to %s: %w", name, n, dst, err)
}

// setLink sends one RTM_SETLINK for the link with this index: new
// namespace, name, MTU and MAC.
func (n *Netns) setLink(index int, dst *Netns, name string, mtu int, mac net.HardwareAddr) error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(dst.FD()))))
	if name != "" {
		req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	}
	if mtu > 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(mtu))))
	}
	if mac != nil {
		req.AddData(nl.NewRtAttr(unix.IFLA_ADDRESS, []byte(mac)))
	}
	req.Sockets = n.raw
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// Route is a static route through a link: Gateway invalid for a directly
// connected destination.
type Route struct {
	Destination netip.Prefix
	Gateway     netip.Addr
}

// ConfigureLink adds addresses, sets the link up or down and adds routes,
// in the order the kernel needs (a route's gateway must be reachable
// through an address of a link that is up). Addresses and routes replace
// equal ones, so a second call changes nothing. IPv6 addresses skip
// duplicate address detection: they are static, and usable at once.
func (n *Netns) ConfigureLink(name string, addrs []netip.Prefix, up bool, routes []Route) error {
	l, err := n.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("%s: link %s: %w", n, name, err)
	}
	return n.configureLink(l, addrs, up, routes)
}

// ConfigureLinkAt is ConfigureLink of the link with that ifindex.
func (n *Netns) ConfigureLinkAt(index int, addrs []netip.Prefix, up bool, routes []Route) error {
	l, err := n.byIndex(index)
	if err != nil {
		return err
	}
	return n.configureLink(l, addrs, up, routes)
}

func (n *Netns) configureLink(l netlink.Link, addrs []netip.Prefix, up bool, routes []Route) error {
	name := l.Attrs().Name
	for _, p := range addrs {
		a := &netlink.Addr{IPNet: prefixNet(p)}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := n.nl.AddrReplace(l, a); err != nil {
			return fmt.Errorf("%s: address %s on %s: %w", n, p, name, err)
		}
	}
	set := n.nl.LinkSetDown
	if up {
		set = n.nl.LinkSetUp
	}
	if err := set(l); err != nil {
		return fmt.Errorf("%s: setting %s %s: %w", n, name, upDown(up), err)
	}
	for _, r := range routes {
		rt := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixNet(r.Destination.Masked())}
		if r.Gateway.IsValid() {
			rt.Gw = net.IP(r.Gateway.AsSlice())
		} else {
			rt.Scope = netlink.SCOPE_LINK
		}
		if err := n.nl.RouteReplace(rt); err != nil {
			return fmt.Errorf("%s: route to %s on %s: %w", n, r.Destination, name, err)
		}
	}
	return nil
}

// RestoreLink gives a link back the addresses and state of st (its name,
// MTU and MAC come back with MoveLink).
func (n *Netns) RestoreLink(name string, st LinkState) error {
	addrs := make([]netip.Prefix, 0, len(st.Addresses))
	for _, a := range st.Addresses {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return fmt.Errorf("recorded address %q of %s: %w", a, name, err)
		}
		addrs = append(addrs, p)
	}
	return n.ConfigureLink(name, addrs, st.Up, nil)
}

// SetLink sets a link down, then renames it and sets MTU and MAC (zero
// values keep): a netdev that came back from a destroyed namespace under
// another name gets its own again. The kernel renames only links that
// are down.
func (n *Netns) SetLink(name string, set LinkSettings) error {
	l, err := n.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("%s: link %s: %w", n, name, err)
	}
	if err := n.nl.LinkSetDown(l); err != nil {
		return fmt.Errorf("%s: setting %s down: %w", n, name, err)
	}
	if set.Name != "" && set.Name != name {
		if err := n.nl.LinkSetName(l, set.Name); err != nil {
			return fmt.Errorf("%s: renaming %s to %s: %w", n, name, set.Name, err)
		}
	}
	if set.MTU > 0 && set.MTU != l.Attrs().MTU {
		if err := n.nl.LinkSetMTU(l, set.MTU); err != nil {
			return fmt.Errorf("%s: MTU %d on %s: %w", n, set.MTU, name, err)
		}
	}
	if set.MAC != "" && set.MAC != l.Attrs().HardwareAddr.String() {
		mac, err := net.ParseMAC(set.MAC)
		if err != nil {
			return fmt.Errorf("MAC %q: %w", set.MAC, err)
		}
		if err := n.nl.LinkSetHardwareAddr(l, mac); err != nil {
			return fmt.Errorf("%s: MAC %s on %s: %w", n, set.MAC, name, err)
		}
	}
	return nil
}

// prefixNet keeps the address's host part ("10.0.0.5/24", not
// "10.0.0.0/24"): for an interface address that is the address.
func prefixNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

func upDown(up bool) string {
	if up {
		return "up"
	}
	return "down"
}
