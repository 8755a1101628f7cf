// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

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
	// LastSpeedMbps is, while SpeedMbps is 0, the speed the agent saw
	// last (probes leave it 0): the bandwidth the PF's device keeps
	// publishing while its link is down.
	LastSpeedMbps int `json:"lastSpeedMbps,omitempty"`
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
	// No MAC: a VF netdev's address is the driver's random one until
	// prepare sets it (hw.VFConfigurator), and reading it for every VF
	// would cost discovery a third of its time.
}

// NetdevDriver reports whether the VF is bound to a kernel network driver
// (not to vfio-pci, not unbound): only such a VF has a netdev to give a
// pod as a share.
func (v VF) NetdevDriver() bool { return v.Driver != "" && v.Driver != "vfio-pci" }

// VFRef names one VF for configuration: VF Index of the PF whose netdev is
// PF. Netdev is the VF's own netdev, needed only for MTU and link state;
// empty when the VF has none (bound to vfio-pci), and then those two
// settings are left alone.
type VFRef struct {
	PF     string `json:"pf"`
	Index  int    `json:"index"`
	Netdev string `json:"netdev,omitempty"`
}

// VFConfig is what the agent sets on a VF at prepare and restores at
// unprepare. The first six fields are set through the PF (the VF's netdev
// may live in another namespace or not exist); MTU and NetdevUp act on the
// VF's netdev. Reading returns every field; applying applies every field,
// except that an empty MAC, a zero MTU and a nil NetdevUp mean "leave as
// is", so applying what was read restores it.
type VFConfig struct {
	// MAC is the administrative MAC ("02:00:00:00:00:01"). All zeroes clears
	// it (mlx5 then lets the VF driver choose).
	MAC string `json:"mac,omitempty"`
	// VLAN is the port VLAN the PF inserts and strips (0: none, 1-4094).
	VLAN int `json:"vlan"`
	// QoS is the 802.1p priority of the port VLAN (0-7).
	QoS int `json:"qos"`
	// MinTxRateMbps and MaxTxRateMbps are the VF's transmit rate limits in
	// Mb/s, the unit of the kernel's VF rate API; 0 means no limit.
	MinTxRateMbps int  `json:"minTxRateMbps"`
	MaxTxRateMbps int  `json:"maxTxRateMbps"`
	SpoofChk      bool `json:"spoofChk"`
	Trust         bool `json:"trust"`
	// MTU of the VF's netdev; 0 leaves it.
	MTU int `json:"mtu,omitempty"`
	// NetdevUp is the administrative state of the VF's netdev; nil leaves it.
	NetdevUp *bool `json:"netdevUp,omitempty"`
	// NodeGUID and PortGUID are an InfiniBand VF's GUIDs
	// ("00:11:22:33:44:55:66:77"); empty leaves them. An InfiniBand VF
	// takes only these, MTU and link state: the Ethernet fields above are
	// not applied to it (they read back as zero).
	NodeGUID string `json:"nodeGUID,omitempty"`
	PortGUID string `json:"portGUID,omitempty"`
}

// VFConfigurator reads and applies VF settings. The sriov backend does it
// with netlink on the PF; the mock records what it is asked (VF setters are
// not supported on the veth links that stand in for VFs).
//
// SetVF applies the fields in a fixed order (MAC, VLAN/QoS, rate, spoof
// check, trust, MTU, link state) and stops at the first error, as the
// hardware would leave it: the caller restores what GetVF returned before.
type VFConfigurator interface {
	GetVF(ref VFRef) (VFConfig, error)
	SetVF(ref VFRef, cfg VFConfig) error
}

// VFLinks finds a VF's netdev in a network namespace (open as nsFD) where
// the kernel cannot tell which PCI function a link belongs to: the mock's
// veth stand-ins, which have no parent device. It returns the link's
// ifindex and name, 0 and "" where the VF is not.
type VFLinks interface {
	VFLink(nsFD int, vfPCIAddress string) (index int, name string, err error)
}

// RDMANetns moves a VF's RDMA device between network namespaces with its
// netdev. The kernel's RDMA subsystem is in one of two modes (`rdma
// system`): shared, where every namespace sees every RDMA device and
// nothing moves, or exclusive, where a device belongs to one namespace and
// is visible only there. The sriov backend does it with RDMA netlink; the
// mock records it.
type RDMANetns interface {
	// Exclusive reports whether the subsystem is in exclusive mode.
	Exclusive() (bool, error)
	// MoveRDMA moves RDMA device name from the network namespace at path
	// from to the one at path to ("" is the agent's own namespace).
	MoveRDMA(name, from, to string) error
}
