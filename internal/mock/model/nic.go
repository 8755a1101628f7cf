// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package model

import (
	"slices"
	"sort"

	"github.com/hwdra/hwdra/internal/hw"
)

// NIC is what one kind of SR-IOV NIC looks like to the kernel.
type NIC struct {
	Vendor, Device, VFDevice string // PCI IDs, lower-case hex without 0x
	Driver, VFDriver         string
	SpeedMbps                int
	TotalVFs                 int // sriov_totalvfs as shipped
	LinkTypes                []hw.LinkType
	// RDMA: the RDMA device is there by default; RDMAName is its prefix
	// ("mlx5_" -> mlx5_0) and RDMAAux the auxiliary device it hangs off
	// since kernel 5.11 ("mlx5_core.rdma" -> <pci dev>/mlx5_core.rdma.0/).
	RDMA               bool
	RDMAName, RDMAAux  string
	VFRDMA             bool // VFs get their own RDMA device (mlx5)
	MACPrefix          string
	MaxMTU             int
	Eswitch            string // devlink eswitch mode at boot
	VFSpoofChkDefault  bool
	VFRateNeedsLinkMax bool // the driver refuses a VF rate above link speed
	// VFMinRateFitsLink: the driver refuses (EINVAL) a VF minimum rate
	// that makes its VFs' minimums add up beyond the link speed (ice).
	VFMinRateFitsLink bool
}

// nicModels: IDs from the PCI IDs database and the drivers' defaults.
var nicModels = map[string]NIC{
	// NVIDIA ConnectX-6 VPI (HDR 200G), DGX A100's compute NIC.
	"cx6": {
		Vendor: "15b3", Device: "101b", VFDevice: "101c",
		Driver: "mlx5_core", VFDriver: "mlx5_core",
		SpeedMbps: 200000, TotalVFs: 127,
		LinkTypes: []hw.LinkType{hw.LinkEthernet, hw.LinkInfiniBand},
		RDMA:      true, RDMAName: "mlx5_", RDMAAux: "mlx5_core.rdma", VFRDMA: true,
		MACPrefix: "b8:ce:f6", MaxMTU: 9978, Eswitch: "legacy",
		VFRateNeedsLinkMax: true,
	},
	// NVIDIA ConnectX-7 (NDR 400G), DGX H100/H200's compute and storage NIC.
	"cx7": {
		Vendor: "15b3", Device: "1021", VFDevice: "101e",
		Driver: "mlx5_core", VFDriver: "mlx5_core",
		SpeedMbps: 400000, TotalVFs: 127,
		LinkTypes: []hw.LinkType{hw.LinkEthernet, hw.LinkInfiniBand},
		RDMA:      true, RDMAName: "mlx5_", RDMAAux: "mlx5_core.rdma", VFRDMA: true,
		MACPrefix: "0c:42:a1", MaxMTU: 9978, Eswitch: "legacy",
		VFRateNeedsLinkMax: true,
	},
	// Intel E810-C (100G). RDMA (irdma) is optional: rdma: true in a profile.
	"e810": {
		Vendor: "8086", Device: "1592", VFDevice: "1889",
		Driver: "ice", VFDriver: "iavf",
		SpeedMbps: 100000, TotalVFs: 128,
		LinkTypes: []hw.LinkType{hw.LinkEthernet},
		RDMAName:  "irdma", RDMAAux: "ice.roce",
		MACPrefix: "b4:96:91", MaxMTU: 9702, Eswitch: "legacy",
		VFSpoofChkDefault: true, VFRateNeedsLinkMax: true, VFMinRateFitsLink: true,
	},
}

// LookupNIC returns the NIC model of a name ("cx7").
func LookupNIC(name string) (NIC, bool) {
	m, ok := nicModels[name]
	return m, ok
}

// HasLinkType tells whether the model's ports can run a link type.
func (m NIC) HasLinkType(t hw.LinkType) bool {
	return slices.Contains(m.LinkTypes, t)
}

// NICNames lists the NIC model names a profile may use.
func NICNames() []string {
	names := make([]string, 0, len(nicModels))
	for n := range nicModels {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
