package mock

import (
	"sort"

	"github.com/hwdra/hwdra/hw"
)

// nicModel is what one kind of SR-IOV NIC looks like to the kernel.
type nicModel struct {
	vendor, device, vfDevice string // PCI IDs, lower-case hex without 0x
	driver, vfDriver         string
	speedMbps                int
	totalVFs                 int // sriov_totalvfs as shipped
	linkTypes                []hw.LinkType
	// rdma: the RDMA device is there by default; rdmaName is its prefix
	// ("mlx5_" -> mlx5_0) and rdmaAux the auxiliary device it hangs off
	// since kernel 5.11 ("mlx5_core.rdma" -> <pci dev>/mlx5_core.rdma.0/).
	rdma               bool
	rdmaName, rdmaAux  string
	vfRDMA             bool // VFs get their own RDMA device (mlx5)
	macPrefix          string
	maxMTU             int
	eswitch            string // devlink eswitch mode at boot
	vfSpoofChkDefault  bool
	vfRateNeedsLinkMax bool // the driver refuses a VF rate above link speed
	// vfMinRateFitsLink: the driver refuses (EINVAL) a VF minimum rate
	// that makes its VFs' minimums add up beyond the link speed (ice).
	vfMinRateFitsLink bool
}

// nicModels: IDs from the PCI IDs database and the drivers' defaults.
var nicModels = map[string]nicModel{
	// NVIDIA ConnectX-6 VPI (HDR 200G), DGX A100's compute NIC.
	"cx6": {
		vendor: "15b3", device: "101b", vfDevice: "101c",
		driver: "mlx5_core", vfDriver: "mlx5_core",
		speedMbps: 200000, totalVFs: 127,
		linkTypes: []hw.LinkType{hw.LinkEthernet, hw.LinkInfiniBand},
		rdma:      true, rdmaName: "mlx5_", rdmaAux: "mlx5_core.rdma", vfRDMA: true,
		macPrefix: "b8:ce:f6", maxMTU: 9978, eswitch: "legacy",
		vfRateNeedsLinkMax: true,
	},
	// NVIDIA ConnectX-7 (NDR 400G), DGX H100/H200's compute and storage NIC.
	"cx7": {
		vendor: "15b3", device: "1021", vfDevice: "101e",
		driver: "mlx5_core", vfDriver: "mlx5_core",
		speedMbps: 400000, totalVFs: 127,
		linkTypes: []hw.LinkType{hw.LinkEthernet, hw.LinkInfiniBand},
		rdma:      true, rdmaName: "mlx5_", rdmaAux: "mlx5_core.rdma", vfRDMA: true,
		macPrefix: "0c:42:a1", maxMTU: 9978, eswitch: "legacy",
		vfRateNeedsLinkMax: true,
	},
	// Intel E810-C (100G). RDMA (irdma) is optional: rdma: true in a profile.
	"e810": {
		vendor: "8086", device: "1592", vfDevice: "1889",
		driver: "ice", vfDriver: "iavf",
		speedMbps: 100000, totalVFs: 128,
		linkTypes: []hw.LinkType{hw.LinkEthernet},
		rdmaName:  "irdma", rdmaAux: "ice.roce",
		macPrefix: "b4:96:91", maxMTU: 9702, eswitch: "legacy",
		vfSpoofChkDefault: true, vfRateNeedsLinkMax: true, vfMinRateFitsLink: true,
	},
}

// NICModels lists the NIC model names a profile may use.
func NICModels() []string {
	names := make([]string, 0, len(nicModels))
	for n := range nicModels {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
