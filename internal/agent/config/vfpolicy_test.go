// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/hw"
)

// TestVFPolicy: each PF gets the first vfPolicy.pfs entry that selects
// it, wholly, else vfPolicy's own settings; without a vfPolicy claims may
// set nothing, and neither may they under an empty one.
func TestVFPolicy(t *testing.T) {
	t.Parallel()
	cx7 := hw.PF{PCIAddress: "0000:17:00.0", Netdev: "ens1f0", VendorID: "15b3", DeviceID: "1021", Driver: "mlx5_core"}
	e810 := hw.PF{PCIAddress: "0000:31:00.0", Netdev: "eno1", VendorID: "8086", DeviceID: "1592", Driver: "ice"}
	const policy = `vfPolicy:
  allowedVLANs: [10, "20-29"]
  allowTrust: true
  pfs:
  - select: {vendorIDs: ["0x15B3"]}
    allowedVLANs: [0, "4000-4094"]
    allowSpoofCheckOff: true
    allowMAC: true
    allowGUIDs: true
`
	for _, tc := range []struct {
		name, yaml string
		pf         hw.PF
		want       VFPolicy
	}{
		{"no vfPolicy", header, cx7, VFPolicy{}},
		{"an empty vfPolicy", header + "vfPolicy: {}\n", cx7, VFPolicy{Where: "vfPolicy"}},
		{"the entry that selects the PF, wholly", header + policy, cx7,
			VFPolicy{Where: "vfPolicy.pfs[0]", VLANs: [][2]int{{0, 0}, {4000, 4094}}, SpoofCheckOff: true, MAC: true, GUIDs: true}},
		{"a PF no entry selects", header + policy, e810, VFPolicy{Where: "vfPolicy", VLANs: [][2]int{{10, 10}, {20, 29}}, Trust: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if got := c.VFPolicy(tc.pf); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("policy of %s: %+v, want %+v", tc.pf.Netdev, got, tc.want)
			}
		})
	}
	c, err := Parse([]byte(header + policy))
	if err != nil {
		t.Fatal(err)
	}
	p := c.VFPolicy(e810)
	for v, want := range map[int]bool{0: false, 10: true, 11: false, 20: true, 29: true, 30: false} {
		if p.AllowsVLAN(v) != want {
			t.Errorf("VLAN %d allowed: %t, want %t", v, !want, want)
		}
	}
	if got := p.VLANList(); got != "10, 20-29" {
		t.Errorf("VLANList %q", got)
	}
	if got := (VFPolicy{}).VLANList(); got != "none" {
		t.Errorf("VLANList of none %q", got)
	}
	if got := c.VFPolicy(cx7).Setting(SettingAllowTrust); got != "vfPolicy.pfs[0].allowTrust" {
		t.Errorf("Setting %q", got)
	}
}

// TestVFPolicyInvalid: bad VLANs and selectors are errors naming the field.
func TestVFPolicyInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, yaml, want string }{
		{"VLAN above 4094", "vfPolicy: {allowedVLANs: [4095]}\n", `vfPolicy.allowedVLANs[0]: Invalid value: "4095": must be a VLAN ID (0 to 4094)`},
		{"negative VLAN", "vfPolicy: {allowedVLANs: [-1]}\n", `vfPolicy.allowedVLANs[0]: Invalid value: "-1"`},
		{"range backwards", "vfPolicy: {allowedVLANs: [\"300-200\"]}\n", `vfPolicy.allowedVLANs[0]: Invalid value: "300-200": must be a range from the lower VLAN ID to the higher`},
		{"not a VLAN", "vfPolicy: {allowedVLANs: [blue]}\n", `vfPolicy.allowedVLANs[0]: Invalid value: "blue"`},
		{"a list for a VLAN", "vfPolicy: {allowedVLANs: [[1]]}\n", `vfPolicy.allowedVLANs[0]: Invalid value: "[1]"`},
		{"entry selector", "vfPolicy:\n  pfs:\n  - select: {pciAddresses: [\"17:00\"]}\n", `vfPolicy.pfs[0].select.pciAddresses[0]: Invalid value: "17:00"`},
		{"entry VLAN", "vfPolicy:\n  pfs:\n  - allowedVLANs: [\"1-5000\"]\n", `vfPolicy.pfs[0].allowedVLANs[0]: Invalid value: "1-5000"`},
		{"unknown field", "vfPolicy: {allowVLANs: [1]}\n", `unknown field "vfPolicy.allowVLANs"`},
		{"a string for a switch", "vfPolicy: {allowTrust: \"yes\"}\n", "vfPolicy.allowTrust"},
		{"unknown vfio field", "vfio: {allowNoIOMMU: true}\n", `unknown field "vfio.allowNoIOMMU"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Parse([]byte(header + tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestAllowsUnsafeNoIOMMU(t *testing.T) {
	t.Parallel()
	for yaml, want := range map[string]bool{header: false, header + "vfio: {}\n": false, header + "vfio: {allowUnsafeNoIOMMU: true}\n": true} {
		c, err := Parse([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		if c.AllowsUnsafeNoIOMMU() != want {
			t.Errorf("%q: AllowsUnsafeNoIOMMU %t", yaml, !want)
		}
	}
	if Default().AllowsUnsafeNoIOMMU() {
		t.Error("allowed without a file")
	}
}
