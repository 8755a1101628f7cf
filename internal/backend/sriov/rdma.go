// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/hw"
)

// NetlinkRDMA moves RDMA devices with RDMA netlink, like `rdma dev set
// <dev> netns <ns>`.
type NetlinkRDMA struct{}

var _ hw.RDMANetns = NetlinkRDMA{}

// Exclusive implements hw.RDMANetns. A kernel without RDMA netlink (no
// ib_core loaded) has no RDMA devices to move: shared.
func (NetlinkRDMA) Exclusive() (bool, error) {
	mode, err := netlink.RdmaSystemGetNetnsMode()
	if err != nil {
		return false, fmt.Errorf("sriov: RDMA netns mode: %w", err)
	}
	return mode == "exclusive", nil
}

// MoveRDMA implements hw.RDMANetns. In exclusive mode a device is visible
// only in its own namespace, so the request goes out from there.
func (NetlinkRDMA) MoveRDMA(name, from, to string) error {
	src, err := OpenNetns(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := OpenNetns(to)
	if err != nil {
		return err
	}
	defer dst.Close()
	h, err := netlink.NewHandleAt(src.ns, unix.NETLINK_RDMA)
	if err != nil {
		return fmt.Errorf("sriov: RDMA netlink in %s: %w", src, err)
	}
	defer h.Close()
	link, err := h.RdmaLinkByName(name)
	if err != nil {
		return fmt.Errorf("sriov: RDMA device %s in %s: %w", name, src, err)
	}
	if err := h.RdmaLinkSetNsFd(link, uint32(dst.FD())); err != nil {
		return fmt.Errorf("sriov: moving RDMA device %s from %s to %s: %w", name, src, dst, err)
	}
	return nil
}
