// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import (
	"errors"
	"fmt"
	"sort"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RouteSource tells which netdevs carry one of the node's default routes.
// Discover marks those PFs so configuration never offers them by accident
// (handing the management NIC's VFs, or worse the PF, to pods).
type RouteSource interface {
	DefaultRouteNetdevs() ([]string, error)
}

// NetlinkRoutes reads the routes of the current network namespace.
//
// It counts default routes (IPv4 and IPv6) in every routing table, not just
// main (policy routing puts management defaults elsewhere), multipath next
// hops, and the links below a routed one: the ports of a bond or bridge and
// the parent of a VLAN or macvlan, recursively, since a PF enslaved to
// bond0 carries bond0's default route.
type NetlinkRoutes struct{}

// DefaultRouteNetdevs implements RouteSource.
func (NetlinkRoutes) DefaultRouteNetdevs() ([]string, error) {
	routes, err := listRoutes()
	if err != nil {
		return nil, err
	}
	routed := map[int]bool{}
	for _, r := range routes {
		if !isDefault(r) {
			continue
		}
		if r.LinkIndex > 0 {
			routed[r.LinkIndex] = true
		}
		for _, nh := range r.MultiPath {
			if nh.LinkIndex > 0 {
				routed[nh.LinkIndex] = true
			}
		}
	}
	if len(routed) == 0 {
		return nil, nil
	}
	links, err := consistent(netlink.LinkList)
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	return expandLowerLinks(routed, links), nil
}

// listRoutes dumps all tables.
func listRoutes() ([]netlink.Route, error) {
	routes, err := consistent(func() ([]netlink.Route, error) {
		return netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, fmt.Errorf("listing routes: %w", err)
	}
	return routes, nil
}

// consistent runs a netlink dump again while the kernel reports it
// interrupted (what it listed changed meanwhile: the result may miss or
// repeat entries), a few times, and then gives up with the error rather
// than take a partial list for the whole: a default route missed would
// offer the node's own uplink to pods.
func consistent[T any](dump func() (T, error)) (T, error) {
	var out T
	var err error
	for range 5 {
		if out, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	var zero T
	return zero, err
}

// isDefault: netlink reports a default route with a nil Dst or, in newer
// versions, 0.0.0.0/0 or ::/0.
func isDefault(r netlink.Route) bool {
	if r.Type != unix.RTN_UNICAST && r.Type != 0 {
		return false // blackhole, unreachable, ...
	}
	if r.Dst == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0 && r.Dst.IP.IsUnspecified()
}

// expandLowerLinks adds the links below routed ones until nothing changes
// and returns the names of all of them, sorted.
func expandLowerLinks(routed map[int]bool, links []netlink.Link) []string {
	for changed := true; changed; {
		changed = false
		for _, l := range links {
			a := l.Attrs()
			if routed[a.Index] {
				continue
			}
			if (a.MasterIndex > 0 && routed[a.MasterIndex]) || lowerOfRouted(l, links, routed) {
				routed[a.Index] = true
				changed = true
			}
		}
	}
	var names []string
	for _, l := range links {
		if routed[l.Attrs().Index] {
			names = append(names, l.Attrs().Name)
		}
	}
	sort.Strings(names)
	return names
}

// stackedTypes are link types whose IFLA_LINK is the device they sit on.
// (A veth's IFLA_LINK is its peer, often an index in another namespace.)
var stackedTypes = map[string]bool{"vlan": true, "macvlan": true, "macvtap": true, "ipvlan": true, "ipoib": true}

// lowerOfRouted: l is the lower device of a routed VLAN, macvlan, ...
func lowerOfRouted(l netlink.Link, links []netlink.Link, routed map[int]bool) bool {
	idx := l.Attrs().Index
	for _, up := range links {
		a := up.Attrs()
		if a.ParentIndex == idx && routed[a.Index] && a.NetNsID < 0 && stackedTypes[up.Type()] {
			return true
		}
	}
	return false
}
