// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import (
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"
)

// LinkID is what the kernel says of a VF's netdev that no one in the
// namespace can change: recorded when the agent moves the netdev into a
// pod, so that it is found there again by identity, never by its name. A
// pod with CAP_NET_ADMIN names its links as it likes: it can rename its VF
// and create a veth under the VF's name.
type LinkID struct {
	// Parent is the PCI function the kernel reports as the link's parent
	// device (IFLA_PARENT_DEV_NAME, bus pci: the netdev's sysfs device
	// link), "" on a kernel that reports none.
	Parent string `json:"parent,omitempty"`
	// Index is the link's ifindex in the pod's namespace and PermMAC its
	// permanent MAC address (IFLA_PERM_ADDRESS), which the driver sets and
	// no one can change: on a kernel that reports no parent device, the
	// link with both.
	Index   int    `json:"index,omitempty"`
	PermMAC string `json:"permMAC,omitempty"`
}

// VFLink finds the netdev of the PCI function at pciAddress in the
// namespace: the link whose parent device is that function or, where the
// kernel reports no parent device (id.Parent empty), the link of id's
// ifindex with id's permanent MAC. It returns the link's ifindex, by
// which the caller then addresses it, and its name; 0 and "" when the
// namespace has no such link (a veth, whatever its name, has neither a
// parent device nor a permanent MAC).
func (n *Netns) VFLink(pciAddress string, id LinkID) (int, string, error) {
	links, err := consistent(n.nl.LinkList)
	if err != nil {
		return 0, "", fmt.Errorf("%s: listing links: %w", n, err)
	}
	attrs := make([]netlink.LinkAttrs, len(links))
	for i, l := range links {
		attrs[i] = *l.Attrs()
	}
	if i := matchVF(attrs, pciAddress, id); i >= 0 {
		return attrs[i].Index, attrs[i].Name, nil
	}
	return 0, "", nil
}

// matchVF is the index in links of the VF's netdev, -1 for none.
func matchVF(links []netlink.LinkAttrs, pciAddress string, id LinkID) int {
	for i, a := range links {
		if a.ParentDevBus == "pci" && a.ParentDev == pciAddress {
			return i
		}
	}
	if id.Parent != "" || id.Index == 0 || id.PermMAC == "" {
		// The kernel named the parent when it was recorded (so it would
		// now too), or nothing was recorded that identifies it.
		return -1
	}
	for i, a := range links {
		if a.Index == id.Index && a.ParentDev == "" && len(a.PermHWAddr) > 0 && strings.EqualFold(a.PermHWAddr.String(), id.PermMAC) {
			return i
		}
	}
	return -1
}

// LinkIDAt reads the identity of the link with that ifindex.
func (n *Netns) LinkIDAt(index int) (LinkID, error) {
	l, err := n.byIndex(index)
	if err != nil {
		return LinkID{}, err
	}
	a := l.Attrs()
	id := LinkID{Index: a.Index}
	if a.ParentDevBus == "pci" {
		id.Parent = a.ParentDev
	}
	if len(a.PermHWAddr) > 0 {
		id.PermMAC = a.PermHWAddr.String()
	}
	return id, nil
}

// LinkID reads the identity of the link of that name: only where its name
// is the agent's to trust (its own namespace, or a pod's that runs no
// container yet).
func (n *Netns) LinkID(name string) (LinkID, error) {
	l, err := n.nl.LinkByName(name)
	if err != nil {
		return LinkID{}, fmt.Errorf("%s: link %s: %w", n, name, err)
	}
	return n.LinkIDAt(l.Attrs().Index)
}
