// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"reflect"
	"strings"
	"testing"
)

// TestBadConfig: each invalid VfConfig field fails the prepare with an
// error naming the claim, the request and the field, before any VF is
// read or changed; so does a setting the PF's driver is known to refuse.
func TestBadConfig(t *testing.T) {
	e := newEnv(t, cx7Node, "")
	switchdev := newEnv(t, `nics: [{model: cx7, count: 1, vfs: 2, netdevs: [sw0], eswitchMode: switchdev}]`, "")
	ib := newEnv(t, `nics: [{model: cx7, count: 1, vfs: 2, netdevs: [ib0], linkType: infiniband}]`, "")
	for _, tc := range []struct {
		name, config, field string
		env                 *env
	}{
		{"MTU too small", `, "mtu": 50`, "mtu", e},
		{"MTU too large", `, "mtu": 9217`, "mtu", e},
		{"multicast MAC", `, "mac": "01:00:5e:00:00:01"`, "mac", e},
		{"malformed MAC", `, "mac": "02:00:00:00:00"`, "mac", e},
		{"VLAN out of range", `, "vlan": 4095`, "vlan", e},
		{"QoS out of range", `, "vlan": 5, "vlanQoS": 8`, "vlanQoS", e},
		{"QoS without VLAN", `, "vlanQoS": 3`, "vlanQoS", e},
		{"interface name too long", `, "interfaceName": "a-very-long-name0"`, "interfaceName", e},
		{"interface name with a slash", `, "interfaceName": "a/b"`, "interfaceName", e},
		{"address without prefix", `, "addresses": ["10.0.0.5"]`, "addresses[0]", e},
		{"route destination", `, "routes": [{"destination": "10.1.0.0"}]`, "routes[0].destination", e},
		{"route gateway family", `, "routes": [{"destination": "10.1.0.0/16", "gateway": "fd00::1"}]`, "routes[0].gateway", e},
		{"wrong type", `, "trust": "yes"`, "trust", e},
		{"unknown field", `, "vlanId": 5`, `unknown field "vlanId"`, e},
		{"VLAN on mlx5 in switchdev mode", `, "vlan": 5`, "vlan", switchdev},
		{"MAC on InfiniBand", `, "mac": "02:00:00:00:00:01"`, "mac", ib},
		{"VLAN on InfiniBand", `, "vlan": 5`, "vlan", ib},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, calls := tc.env.vfs.Snapshot(), len(tc.env.vfs.Records())
			c := tc.env.allocate(newClaim(tc.config, share("fast-nic", "1G")))
			defer tc.env.alloc.Release(c)
			_, err := tc.env.prepare(c)
			if err == nil {
				t.Fatal("prepared")
			}
			for _, want := range []string{"ns/" + c.Name, `request "fast-nic"`, tc.field} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not name %s: %v", want, err)
				}
			}
			if len(tc.env.vfs.Records()) != calls || !reflect.DeepEqual(tc.env.vfs.Snapshot(), before) {
				t.Error("a VF was changed")
			}
			if held := tc.env.driver.Held(); len(held) > 0 {
				t.Errorf("held %v", held)
			}
		})
	}
}
