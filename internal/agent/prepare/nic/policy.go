// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"errors"
	"fmt"
	"net"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwdra/hwdra/api"
	sriovv1alpha1 "github.com/hwdra/hwdra/api/sriov/v1alpha1"
	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/hw"
)

// Policy says what claims may set on the VFs of a PF (*config.AgentConfig).
type Policy interface {
	VFPolicy(pf hw.PF) config.VFPolicy
}

// requestConfig is the VfConfig a request's VFs get, and where its
// settings came from: the DeviceClass's (the administrator's) and the
// claim's (its author's).
type requestConfig struct {
	// merged is what applies, defaulted: the last configuration's fields
	// (the claim's over the class's, whole, as ForRequest has it), except
	// mac, vlan with vlanQoS, trust, spoofCheck and the GUIDs, which stay
	// the class's unless the claim sets them.
	merged *sriovv1alpha1.VfConfig
	// class is the class's last configuration, defaulted (the defaults
	// where it has none); claim the claim's last, as written (nil: none)
	// and claimFrom where it is ("config[1] from the claim").
	class     *sriovv1alpha1.VfConfig
	claim     *sriovv1alpha1.VfConfig
	claimFrom string
}

// configFor reads a request's VfConfigs.
func configFor(claim *resourceapi.ResourceClaim, request string) (requestConfig, error) {
	layers, err := api.Layers(claim, device.NICDriver, request, &sriovv1alpha1.VfConfig{})
	if err != nil {
		return requestConfig{}, err
	}
	rc := requestConfig{class: &sriovv1alpha1.VfConfig{}}
	last := rc.class
	for _, l := range layers {
		if l.Class {
			rc.class = l.Config.DeepCopy()
		} else {
			rc.claim, rc.claimFrom = l.Config, l.From
		}
		last = l.Config
	}
	rc.merged = last.DeepCopy()
	rc.class.Default()
	keepClass(rc.merged, rc.class, rc.claim)
	rc.merged.Default()
	return rc, nil
}

// keepClass sets the administrator's fields of merged: the claim's where
// it sets them, else the class's. vlan and vlanQoS go together: a claim's
// vlan comes with its own priority (none if it gives none).
func keepClass(merged, class, claim *sriovv1alpha1.VfConfig) {
	if claim == nil {
		claim = &sriovv1alpha1.VfConfig{}
	}
	pick := func(claimed, classes string) string {
		if claimed != "" {
			return claimed
		}
		return classes
	}
	merged.MAC = pick(claim.MAC, class.MAC)
	merged.NodeGUID = pick(claim.NodeGUID, class.NodeGUID)
	merged.PortGUID = pick(claim.PortGUID, class.PortGUID)
	merged.VLAN, merged.VLANQoS = class.VLAN, class.VLANQoS
	if claim.VLAN != nil {
		merged.VLAN, merged.VLANQoS = claim.VLAN, claim.VLANQoS
	}
	merged.Trust, merged.SpoofCheck = class.Trust, class.SpoofCheck
	if claim.Trust != nil {
		merged.Trust = claim.Trust
	}
	if claim.SpoofCheck != nil {
		merged.SpoofCheck = claim.SpoofCheck
	}
}

// checkPolicy refuses what the claim's own VfConfig asks of a VF of pf
// beyond its class's settings and what the PF's policy allows, naming
// each field, the PF and the setting that forbids it. A claim may ask for
// less (trust false, spoof checking on) and repeat its class's values.
func checkPolicy(rc requestConfig, pf hw.PF, pol config.VFPolicy) error {
	c, class := rc.claim, rc.class
	if c == nil {
		return nil
	}
	var errs []error
	unset := ""
	if pol.Where == "" {
		unset = " (the agent's configuration has no vfPolicy)"
	}
	refuse := func(field string, value any, setting, why string) {
		errs = append(errs, fmt.Errorf("%s: %v (%s) is not allowed on PF %s: %s%s %s",
			field, value, rc.claimFrom, pfName(pf), pol.Setting(setting), unset, why))
	}
	if c.MAC != "" && !sameHW(c.MAC, class.MAC) && !pol.MAC {
		refuse("mac", c.MAC, config.SettingAllowMAC, "is off: the VF keeps its own MAC address, or its DeviceClass's")
	}
	if c.VLAN != nil {
		vlan, qos := *c.VLAN, deref(c.VLANQoS)
		sameAsClass := vlan == deref(class.VLAN) && qos == deref(class.VLANQoS)
		switch {
		case sameAsClass || pol.AllowsVLAN(vlan):
		case vlan == deref(class.VLAN):
			refuse("vlanQoS", qos, config.SettingAllowedVLANs,
				fmt.Sprintf("does not list VLAN %d (it lists %s): a claim sets the priority only on a VLAN it may choose; its DeviceClass's priority is %d", vlan, pol.VLANList(), deref(class.VLANQoS)))
		default:
			refuse("vlan", vlan, config.SettingAllowedVLANs,
				fmt.Sprintf("does not list it (it lists %s); the DeviceClass's VLAN is %s", pol.VLANList(), vlanName(deref(class.VLAN))))
		}
	}
	if deref(c.Trust) && !*class.Trust && !pol.Trust {
		refuse("trust", true, config.SettingAllowTrust, "is off: a trusted VF may change its MAC address and enter promiscuous mode")
	}
	if c.SpoofCheck != nil && !*c.SpoofCheck && *class.SpoofCheck && !pol.SpoofCheckOff {
		refuse("spoofCheck", false, config.SettingAllowSpoofCheckOff, "is off: without spoof checking the VF may send frames with any source MAC address")
	}
	for _, g := range []struct{ name, claimed, classes string }{{"nodeGUID", c.NodeGUID, class.NodeGUID}, {"portGUID", c.PortGUID, class.PortGUID}} {
		if g.claimed != "" && !sameHW(g.claimed, g.classes) && !pol.GUIDs {
			refuse(g.name, g.claimed, config.SettingAllowGUIDs, "is off: the VF keeps its own GUIDs, or its DeviceClass's")
		}
	}
	return errors.Join(errs...)
}

// sameHW: two MAC addresses or GUIDs are the same (in any case or
// separator); an empty one is no address.
func sameHW(a, b string) bool {
	x, err1 := net.ParseMAC(a)
	y, err2 := net.ParseMAC(b)
	return err1 == nil && err2 == nil && strings.EqualFold(x.String(), y.String())
}

func vlanName(v int) string {
	if v == 0 {
		return "none (untagged)"
	}
	return fmt.Sprint(v)
}
