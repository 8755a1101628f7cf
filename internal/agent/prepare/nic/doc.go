// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package nic is the sriov.hwdra.io side of prepare: a prepare.Driver that
// reserves and configures SR-IOV VFs for claims and restores them after.
//
// # What a claim gets
//
// A share of a PF (a shared device, one allocation result with a shareID)
// gets a VF of that PF of its own. The VF is the free one with the lowest
// index: free means no claim holds it (the driver's reservations, rebuilt
// from the checkpoint's records at start) and usable for a netdev share,
// that is bound to the PF's kernel VF driver with its netdev in the
// agent's network namespace. VFs bound to vfio-pci or to no driver, and
// VFs whose netdev is elsewhere (moved into a pod by someone else), are
// never handed out as shares: the NRI step moves a share's netdev into the
// pod. Several shares of one PF in one claim each get their own VF. With
// no free VF left the prepare fails naming the PF; the scheduler counts
// VFs (capacity sriov.hwdra.io/vfs) so this means a VF is unusable or
// held by a claim still being unprepared.
//
// The VF's transmit rate limit (max_tx_rate, Mb/s) is set to the share's
// consumed bandwidth, so what the scheduler counted is what the wire
// enforces; min_tx_rate is cleared (no guarantee is promised beyond the
// scheduler's accounting, and mlx5 needs eswitch QoS for it). MAC, port
// VLAN and QoS, trust and spoof checking (InfiniBand: the GUIDs) come
// from the VfConfig, and the MTU too (default: the PF's MTU, as the
// VfConfig documents).
//
// # Whose settings
//
// The DeviceClass's VfConfig is the administrator's, the claim's its
// author's (api.Layers tells them apart). The claim's last VfConfig
// replaces its class's for the pod-side fields (interface name, MTU,
// addresses, routes), but the class's MAC, VLAN and QoS, trust, spoof
// checking and GUIDs stay unless the claim sets them, and the claim may
// set them only as the agent's vfPolicy allows for the VF's PF
// (config.VFPolicy; by default not at all) or to its class's values, or
// ask for less (trust off, spoof checking on). Plan refuses more, naming
// the field, the PF and the setting, before any VF is reserved.
//
// A VF bound to vfio-pci in a VFIO group without an IOMMU
// (/dev/vfio/noiommu-<N>) is refused before it is reserved, unless the
// configuration allows such groups (vfio.allowUnsafeNoIOMMU).
//
// An exclusive device is the VF it names, configured the same way except
// that its rate limits are left as they were: the claim has the whole VF.
//
// # Crash safety
//
// Before each VF is touched, the ledger
// (<state dir>/sriov.hwdra.io.ledger.json, a state.Ledger) gets its
// original settings as read from the hardware, keyed by the VF's PCI
// address, with the claim; the claim's record gets the same when the
// prepare completes (one checkpoint write, one fsync). Unprepare, and a
// rollback, restore the VF from that saved original: SetVF stops at the
// first field the driver refuses, so the hardware's state after a failure
// is never a reliable original. After a crash, Reclaim restores every VF
// the ledger lists that no prepared claim holds, unless the claim the
// ledger names is still allocated to the node (its record lost with a
// corrupt checkpoint, the VF maybe in a running pod): that VF stays until
// the claim is gone. Ledger entries of an earlier boot are dropped, as the
// VFs were reset with the reboot.
//
// # Metadata and CDI
//
// Each device's metadata is immediate: resource.kubernetes.io/pciBusID
// (the VF), sriov.hwdra.io/ mode, pfName, pfPciAddress, vfIndex,
// bandwidth (shares: the consumed bandwidth as a quantity, "10G"),
// rdmaDevice (if the VF has one), mac, vlan and vlanQoS (if set).
//
// The interface name, IP addresses and routes of the VfConfig are applied
// later, when the pod's network namespace exists, by the NRI plugin
// (package metadata/nri): they are kept in the claim's record (VF.Network),
// with the VF's PCI address, host netdev and RDMA device and the pods the
// claim is reserved for (Record.Pods), which that plugin reads from the
// prepared claims. It then rewrites the metadata with networkData
// (generation 2). With that plugin (Options.Network), prepare refuses a
// NIC claim while the runtime's NRI connection is down, since the pod
// would start without its interface, and unprepare first returns a VF
// still in a pod (no stop hook came) before restoring its settings.
//
// Every VF gets a CDI device (the claim's CDI spec is also where its record
// survives a lost checkpoint), with the device nodes a container needs:
//   - RDMA (a VF with its own RDMA device, mlx5's): /dev/infiniband/uverbs<n>
//     of that RDMA device, and /dev/infiniband/rdma_cm where rdma_ucm is
//     loaded. (umad and issm, for subnet management, are not given.)
//   - An exclusive VF bound to vfio-pci: /dev/vfio/vfio and
//     /dev/vfio/<IOMMU group>.
//
// Nodes are fully specified from sysfs (type, major, minor), so runtimes
// need no host node to stat. The CDI devices also set, for each device,
// HWDRA_SRIOV_<REQUEST>_PCI_ADDRESS (the VF's PCI address) and, with RDMA,
// HWDRA_SRIOV_<REQUEST>_RDMA_DEVICE, <REQUEST> being the request name in
// upper case with every other character "_" ("nic/fast" is NIC_FAST).
// A request with several devices numbers them: HWDRA_SRIOV_NIC_0_...,
// HWDRA_SRIOV_NIC_1_... A plain netdev VF's CDI device sets only that.
package nic
