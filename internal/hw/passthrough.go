// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package hw

// PassthroughGPU is an NVIDIA GPU bound to vfio-pci, found through sysfs:
// NVML cannot see it, a VM launcher opens it through its VFIO group.
type PassthroughGPU struct {
	// PCIBusID is the canonical, lower-case PCI address ("0000:3b:00.0").
	PCIBusID string `json:"pciBusID"`
	VendorID string `json:"vendorID"` // "10de"
	DeviceID string `json:"deviceID"` // "2330"
	// ProductName is the PCI IDs database's name of the device
	// ("GH100 [H100 SXM5 80GB]"), or "NVIDIA device 2330" without one.
	ProductName string `json:"productName"`
	NUMANode    int    `json:"numaNode"`
	// PCIeRoot is the PCIe root complex ("pci0000:00"), empty when unknown.
	PCIeRoot string `json:"pcieRoot,omitempty"`
	// IOMMUGroup is the device's IOMMU group: /dev/vfio/<group>.
	IOMMUGroup int `json:"iommuGroup"`
}
