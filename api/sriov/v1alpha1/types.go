// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"fmt"
	"net"
	"net/netip"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// VfConfig configures a VF (a bandwidth share of a PF, or an exclusive VF)
// for a pod.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type VfConfig struct {
	metav1.TypeMeta `json:",inline"`
	// InterfaceName is the VF's name inside the pod. Default: net1,
	// net2, ... for the pod's VFs without a name, in a stable order (by
	// claim namespace and name, then the order of the claim's requests),
	// skipping names other VFs of the pod take.
	InterfaceName string `json:"interfaceName,omitempty"`
	// MTU of the VF netdev. Default: the PF's MTU.
	MTU *int `json:"mtu,omitempty"`
	// MAC address to set; default: keep the VF's.
	MAC string `json:"mac,omitempty"`
	// VLAN ID (1-4094) the PF tags the VF's traffic with; 0 or unset: none.
	VLAN *int `json:"vlan,omitempty"`
	// VLANQoS is the 802.1p priority (0-7) of VLAN-tagged traffic.
	VLANQoS *int `json:"vlanQoS,omitempty"`
	// Trust lets the VF change its MAC and enter promiscuous mode.
	// Default false.
	Trust *bool `json:"trust,omitempty"`
	// SpoofCheck drops frames whose source MAC is not the VF's.
	// Default true.
	SpoofCheck *bool `json:"spoofCheck,omitempty"`
	// NodeGUID and PortGUID are an InfiniBand VF's GUIDs, 8 bytes like
	// 00:11:22:33:44:55:66:77; default: keep the VF's. InfiniBand VFs take
	// these instead of mac, vlan, vlanQoS, trust and spoofCheck (and
	// Ethernet VFs take no GUIDs).
	NodeGUID string `json:"nodeGUID,omitempty"`
	PortGUID string `json:"portGUID,omitempty"`
	// Addresses are static IP addresses in CIDR form ("10.0.0.5/24").
	Addresses []string `json:"addresses,omitempty"`
	// Routes are static routes through the VF.
	Routes []Route `json:"routes,omitempty"`
}

// Route is a static route.
type Route struct {
	// Destination in CIDR form ("0.0.0.0/0", "10.1.0.0/16").
	Destination string `json:"destination"`
	// Gateway address; empty for a directly connected route.
	Gateway string `json:"gateway,omitempty"`
}

// DefaultInterfacePrefix names the pod's VFs that have no interfaceName:
// net1, net2, ...
const DefaultInterfacePrefix = "net"

// Default fills in defaults. The interface name stays empty: the default
// depends on the pod's other VFs.
func (c *VfConfig) Default() {
	if c.SpoofCheck == nil {
		t := true
		c.SpoofCheck = &t
	}
	if c.Trust == nil {
		f := false
		c.Trust = &f
	}
}

// Validate checks every field and reports each problem with its path.
func (c *VfConfig) Validate() field.ErrorList {
	var errs field.ErrorList
	if msgs := validateIfName(c.InterfaceName); c.InterfaceName != "" && len(msgs) > 0 {
		errs = append(errs, field.Invalid(field.NewPath("interfaceName"), c.InterfaceName, msgs[0]))
	}
	if c.MTU != nil && (*c.MTU < 68 || *c.MTU > 9216) {
		errs = append(errs, field.Invalid(field.NewPath("mtu"), *c.MTU, "must be between 68 and 9216"))
	}
	if c.MAC != "" {
		hw, err := net.ParseMAC(c.MAC)
		switch {
		case err != nil || len(hw) != 6:
			errs = append(errs, field.Invalid(field.NewPath("mac"), c.MAC, "must be a 6-byte MAC address like 02:00:00:00:00:01"))
		case hw[0]&1 == 1:
			errs = append(errs, field.Invalid(field.NewPath("mac"), c.MAC, "must be a unicast address"))
		}
	}
	for _, g := range []struct{ name, value string }{{"nodeGUID", c.NodeGUID}, {"portGUID", c.PortGUID}} {
		if hw, err := net.ParseMAC(g.value); g.value != "" && (err != nil || len(hw) != 8) {
			errs = append(errs, field.Invalid(field.NewPath(g.name), g.value, "must be an 8-byte GUID like 00:11:22:33:44:55:66:77"))
		}
	}
	if c.VLAN != nil && (*c.VLAN < 0 || *c.VLAN > 4094) {
		errs = append(errs, field.Invalid(field.NewPath("vlan"), *c.VLAN, "must be between 0 and 4094"))
	}
	if c.VLANQoS != nil {
		if *c.VLANQoS < 0 || *c.VLANQoS > 7 {
			errs = append(errs, field.Invalid(field.NewPath("vlanQoS"), *c.VLANQoS, "must be between 0 and 7"))
		} else if c.VLAN == nil || *c.VLAN == 0 {
			errs = append(errs, field.Invalid(field.NewPath("vlanQoS"), *c.VLANQoS, "needs a vlan"))
		}
	}
	for i, a := range c.Addresses {
		if _, err := netip.ParsePrefix(a); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("addresses").Index(i), a, "must be an address in CIDR form like 10.0.0.5/24"))
		}
	}
	for i, r := range c.Routes {
		p := field.NewPath("routes").Index(i)
		dst, err := netip.ParsePrefix(r.Destination)
		if err != nil {
			errs = append(errs, field.Invalid(p.Child("destination"), r.Destination, "must be a CIDR like 10.1.0.0/16"))
		}
		if r.Gateway != "" {
			gw, err := netip.ParseAddr(r.Gateway)
			if err != nil {
				errs = append(errs, field.Invalid(p.Child("gateway"), r.Gateway, "must be an IP address"))
			} else if dst.IsValid() && gw.Is4() != dst.Addr().Is4() {
				errs = append(errs, field.Invalid(p.Child("gateway"), r.Gateway, "must be of the destination's address family"))
			}
		}
	}
	return errs
}

// validateIfName: Linux interface names are at most 15 bytes, no '/',
// no whitespace, not "." or "..".
func validateIfName(name string) []string {
	switch {
	case len(name) == 0 || len(name) > 15:
		return []string{"must be 1 to 15 characters"}
	case name == "." || name == "..":
		return []string{"must not be . or .."}
	}
	for _, r := range name {
		if r == '/' || r == ':' || r <= ' ' || r > '~' {
			return []string{fmt.Sprintf("must not contain %q", r)}
		}
	}
	return nil
}
