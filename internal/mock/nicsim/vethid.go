// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nicsim

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// VFLink finds a VF's veth stand-in in the network namespace open as
// nsFD, as the kernel finds a VF's netdev by its parent device: a veth has
// no parent device, so the stand-in is known by its peer instead, which
// stays in the mock's namespace (hwp<pf>v<vf>) where no pod can reach it.
// The stand-in is the link at the other end of that peer: the peer's
// IFLA_LINK is its ifindex and the peer's link netnsid says in which
// namespace. A link a pod makes, whatever its name, is the peer of
// nothing of the mock's. It returns the stand-in's ifindex and name, 0
// and "" when it is not in that namespace.
func (n *NICs) VFLink(nsFD int, pciAddress string) (int, string, error) {
	n.mu.Lock()
	v := n.veths
	n.mu.Unlock()
	if v == nil {
		return 0, "", errors.New("mock: the NICs have no veth stand-ins")
	}
	var s *vethVF
	for _, c := range v.vfs {
		if c.vf.addr.String() == pciAddress {
			s = c
		}
	}
	if s == nil {
		return 0, "", nil // not a VF with a netdev
	}
	peer, err := v.handle.LinkByName(s.peer)
	if err != nil {
		// Gone with a pod's namespace, not recreated yet.
		return 0, "", nil //nolint:nilerr // no peer: the stand-in is nowhere
	}
	a := peer.Attrs()
	same, err := sameNetns(int(v.ns), nsFD)
	if err != nil {
		return 0, "", err
	}
	switch {
	case a.NetNsID < 0 && !same, a.NetNsID >= 0 && same:
		return 0, "", nil // the stand-in is in another namespace
	case a.NetNsID >= 0:
		id, err := v.handle.GetNetNsIdByFd(nsFD)
		if err != nil {
			return 0, "", fmt.Errorf("mock: the id of namespace fd %d: %w", nsFD, err)
		}
		if id != a.NetNsID {
			return 0, "", nil
		}
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(nsFD), unix.NETLINK_ROUTE)
	if err != nil {
		return 0, "", fmt.Errorf("mock: netlink in namespace fd %d: %w", nsFD, err)
	}
	defer h.Close()
	l, err := h.LinkByIndex(a.ParentIndex)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return 0, "", nil
		}
		return 0, "", fmt.Errorf("mock: the stand-in of VF %s: %w", pciAddress, err)
	}
	if l.Type() != "veth" {
		return 0, "", nil
	}
	return l.Attrs().Index, l.Attrs().Name, nil
}

// sameNetns: two namespace file descriptors are the same namespace.
func sameNetns(a, b int) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Fstat(a, &sa); err != nil {
		return false, err
	}
	if err := unix.Fstat(b, &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}
