// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"k8s.io/apimachinery/pkg/types"

	sriovv1alpha1 "github.com/hwdra/hwdra/api/sriov/v1alpha1"
	"github.com/hwdra/hwdra/internal/hw"
)

// Record is the driver's account of one claim's side effects, kept in the
// checkpoint. Its fields are the checkpoint format: renaming one makes
// older checkpoints unreadable (the checkpoint decoder rejects unknown
// fields), so change them only with a new checkpoint version.
type Record struct {
	// VFs are the claim's VFs in the order they were configured. A VF is
	// listed before it is touched, so it may never have been changed.
	VFs []VF `json:"vfs,omitempty"`
	// Pods are the UIDs of the pods the claim was reserved for at
	// prepare (status.reservedFor): the NRI hook moves the VFs into the
	// network namespace of the first of them to start.
	Pods []types.UID `json:"pods,omitempty"`
}

// VF is one VF a claim holds.
type VF struct {
	// Request, Pool, Device and ShareID identify the allocation result.
	Request string     `json:"request"`
	Pool    string     `json:"pool"`
	Device  string     `json:"device"`
	ShareID *types.UID `json:"shareID,omitempty"`
	// PFAddress is the PF's PCI address, PF its netdev (VF settings go
	// through it), Index the VF's index on it.
	PFAddress string `json:"pfPciAddress"`
	PF        string `json:"pf"`
	Index     int    `json:"index"`
	// PCIAddress is the VF's; Netdev its netdev when it was prepared ("" for
	// a vfio-pci VF).
	PCIAddress string `json:"pciAddress"`
	Netdev     string `json:"netdev,omitempty"`
	// RDMADevice is the VF's own RDMA device ("mlx5_3"), "" if none.
	RDMADevice string `json:"rdmaDevice,omitempty"`
	// Original is the VF's configuration before this claim, restored at
	// unprepare; Applied what prepare set.
	Original hw.VFConfig `json:"original"`
	Applied  hw.VFConfig `json:"applied"`
	// Network is the pod-side configuration the NRI hook applies once the
	// pod's network namespace exists.
	Network Network `json:"network"`
}

// Network is what the NRI hook applies to the VF's netdev in the pod.
type Network struct {
	// InterfaceName is the VfConfig's, "" for the default (net1, ...).
	InterfaceName string                `json:"interfaceName"`
	Addresses     []string              `json:"addresses,omitempty"`
	Routes        []sriovv1alpha1.Route `json:"routes,omitempty"`
}

// LedgerEntry is what the ledger keeps of a VF whose settings the agent
// changed, keyed by the VF's PCI address: enough to restore it without
// the claim's record.
type LedgerEntry struct {
	Claim  types.UID `json:"claim"`
	BootID string    `json:"bootID"`
	PF     string    `json:"pf"`
	// PFAddress is the PF's PCI address: the lock to take.
	PFAddress string `json:"pfAddress,omitempty"`
	Index     int    `json:"index"`
	// Original is the VF's configuration before the agent changed it.
	Original hw.VFConfig `json:"original"`
}
