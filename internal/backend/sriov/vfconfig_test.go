// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package sriov

import (
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/hw"
)

// TestVFFieldsPerLinkType: an InfiniBand VF is sent its GUIDs and nothing
// of Ethernet (its driver refuses MAC, VLAN, rate, spoof checking and
// trust); an Ethernet VF every Ethernet setting and no GUID.
func TestVFFieldsPerLinkType(t *testing.T) {
	for _, tc := range []struct {
		name string
		ib   bool
		cfg  hw.VFConfig
		want string
	}{
		{"Ethernet with MAC", false, hw.VFConfig{MAC: "02:00:00:00:00:01", VLAN: 5, NodeGUID: "00:11:22:33:44:55:66:77"}, "MAC,VLAN,rate,spoofchk,trust"},
		{"Ethernet keeping its MAC", false, hw.VFConfig{}, "VLAN,rate,spoofchk,trust"},
		{"InfiniBand with GUIDs", true, hw.VFConfig{MAC: "02:00:00:00:00:01", VLAN: 5, MaxTxRateMbps: 100,
			NodeGUID: "00:11:22:33:44:55:66:77", PortGUID: "00:11:22:33:44:55:66:78"}, "node GUID,port GUID"},
		{"InfiniBand keeping its GUIDs", true, hw.VFConfig{SpoofChk: true}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := strings.Join(vfFields(tc.ib, tc.cfg), ","); got != tc.want {
				t.Errorf("fields %q, want %q", got, tc.want)
			}
		})
	}
}
