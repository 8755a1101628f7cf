package hw

// LinkType is the link layer of a NIC port.
type LinkType string

const (
	LinkEthernet   LinkType = "ethernet"
	LinkInfiniBand LinkType = "infiniband"
)

// PF is one SR-IOV capable physical function.
type PF struct {
	// PCIAddress is the canonical, lower-case PCI address ("0000:17:00.0").
	PCIAddress string `json:"pciAddress"`
	// Netdev is the PF's network interface name, empty if it has none.
	Netdev   string   `json:"netdev,omitempty"`
	VendorID string   `json:"vendorID"` // "15b3"
	DeviceID string   `json:"deviceID"` // "1021"
	Driver   string   `json:"driver,omitempty"`
	NUMANode int      `json:"numaNode"`
	PCIeRoot string   `json:"pcieRoot,omitempty"`
	LinkType LinkType `json:"linkType,omitempty"`
	// RDMADevice is the RDMA device name ("mlx5_0"), empty without RDMA.
	RDMADevice string `json:"rdmaDevice,omitempty"`
	MAC        string `json:"mac,omitempty"`
	MTU        int    `json:"mtu,omitempty"`
	LinkUp     bool   `json:"linkUp"`
	// SpeedMbps is the negotiated link speed; 0 when unknown or down.
	SpeedMbps int `json:"speedMbps"`
	// EswitchMode is devlink's eswitch mode ("legacy", "switchdev"), empty
	// when the driver reports none.
	EswitchMode string `json:"eswitchMode,omitempty"`
	TotalVFs    int    `json:"totalVFs"`
	NumVFs      int    `json:"numVFs"`
	// DefaultRoute: the PF carries one of the node's default routes.
	DefaultRoute bool `json:"defaultRoute,omitempty"`
	VFs          []VF `json:"vfs,omitempty"`
}

// VF is one virtual function of a PF.
type VF struct {
	Index      int    `json:"index"`
	PCIAddress string `json:"pciAddress"`
	Netdev     string `json:"netdev,omitempty"`
	Driver     string `json:"driver,omitempty"`
	DeviceID   string `json:"deviceID,omitempty"`
	MAC        string `json:"mac,omitempty"`
}
