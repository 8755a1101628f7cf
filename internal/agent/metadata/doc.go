// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package metadata is what containers and the cluster read about
// prepared devices: KEP-5304 device metadata, and the ResourceClaim's
// status.devices.
//
// # Device metadata
//
// The kubelet plugin library writes one metadata file per claim request
// (kubeletplugin EnableDeviceMetadata), and a container reads it under
// /var/run/kubernetes.io/dra-device-attributes/. Its content comes from
// here, in two kinds:
//
//   - Immediate, written at prepare, before any container exists: GPU
//     (whole GPUs, MIG partitions, vGPUs, shares: every published
//     attribute plus a MIG device's UUID and instance IDs,
//     a vGPU's mediated device, a share's MPS limits) and NIC (the VF's
//     PCI address and index, the PF, a share's transmit rates, MAC, VLAN,
//     RDMA device). Attributes only: no capacity is one (a share's
//     figures are its limits as enforced). prepare/gpu and prepare/nic
//     build it with GPU.Attributes and NIC.Attributes.
//   - Deferred, for a VF: the interface as the pod sees it (name,
//     addresses, MAC) exists only once the VF is in the pod's network
//     namespace. The NRI plugin (package podnet) moves it there when the
//     sandbox starts and rewrites the request's file with Network's
//     networkData (generation 2) before any container of the pod starts:
//     the library replaces the file by rename, so a container started
//     earlier would keep the old one.
//
// # Claim status
//
// StatusWriter applies each claim's status.devices entries (one per
// device, keyed by driver, pool, device and shareID, so other drivers'
// entries survive) by server-side apply with the driver's name as field
// manager, in the background: a GPU device's Ready condition and data
// (GPUStatus, GPUData), a VF's networkData with Ready and NetworkReady.
// It retries what can succeed (timeouts, server errors, conflicts) with
// backoff, drops what cannot (forbidden, invalid, the claim gone) and
// says each kind of refusal once; WriteObserver counts every request.
package metadata
