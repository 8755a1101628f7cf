// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/hw"
)

// testPFs: two CX7 compute PFs, an E810 carrying the default route, an
// E810 without VFs and a PF bound to vfio-pci (no netdev).
func testPFs() []hw.PF {
	vfs := []hw.VF{{Index: 0}, {Index: 1}}
	return []hw.PF{
		{PCIAddress: "0000:17:00.0", Netdev: "ens1f0", VendorID: "15b3", DeviceID: "1021", Driver: "mlx5_core", NumVFs: 2, VFs: vfs},
		{PCIAddress: "0000:31:00.0", Netdev: "eno1", VendorID: "8086", DeviceID: "1592", Driver: "ice", NumVFs: 2, VFs: vfs, DefaultRoute: true},
		{PCIAddress: "0000:32:00.0", Netdev: "eno2", VendorID: "8086", DeviceID: "1592", Driver: "ice"},
		{PCIAddress: "0000:4b:00.0", VendorID: "15b3", DeviceID: "1021", Driver: "vfio-pci", NumVFs: 2, VFs: vfs},
		{PCIAddress: "0000:b1:00.0", Netdev: "ens2f0", VendorID: "15b3", DeviceID: "1021", Driver: "mlx5_core", NumVFs: 2, VFs: vfs},
		{PCIAddress: "0000:ca:00.0", Netdev: "ens3f0", VendorID: "15b3", DeviceID: "1021", Driver: "mlx5_core", NumVFs: 4},
	}
}

type outcome struct {
	mode Mode
	rule int
	skip string // substring of the reason
}

func TestResolve(t *testing.T) {
	t.Parallel()
	skipRoute := outcome{skip: "carries a default route"}
	skipNoVFs := outcome{skip: "no VFs enabled"}
	skipNoNetdev := outcome{skip: `no netdev (driver "vfio-pci")`}
	for _, tc := range []struct {
		name string
		yaml string // "" for no file
		want map[string]outcome
	}{{
		name: "no file: every PF with VFs shared, but not the default route",
		want: map[string]outcome{
			"0000:17:00.0": {mode: ModeShared, rule: -1}, "0000:31:00.0": skipRoute, "0000:32:00.0": skipNoVFs,
			"0000:4b:00.0": skipNoNetdev, "0000:b1:00.0": {mode: ModeShared, rule: -1},
			"0000:ca:00.0": {skip: "sriov_numvfs is 4 but no VF could be read"},
		},
	}, {
		name: "a file with only health: the NICs as without a file",
		yaml: header + "health:\n  xids: {ignore: [63]}\n",
		want: map[string]outcome{
			"0000:17:00.0": {mode: ModeShared, rule: -1}, "0000:31:00.0": skipRoute, "0000:32:00.0": skipNoVFs,
			"0000:4b:00.0": skipNoNetdev, "0000:b1:00.0": {mode: ModeShared, rule: -1},
		},
	}, {
		name: "a catch-all does not name the default-route PF",
		yaml: header + "nics:\n- mode: exclusive\n",
		want: map[string]outcome{
			"0000:17:00.0": {mode: ModeExclusive}, "0000:31:00.0": skipRoute, "0000:32:00.0": skipNoVFs,
			"0000:4b:00.0": skipNoNetdev, "0000:b1:00.0": {mode: ModeExclusive},
		},
	}, {
		name: "selecting by vendor does not name it either",
		yaml: header + "nics:\n- select: {vendorIDs: [\"8086\"]}\n",
		want: map[string]outcome{
			"0000:17:00.0": {skip: "no nics[] entry selects it"}, "0000:31:00.0": skipRoute, "0000:32:00.0": skipNoVFs,
			"0000:4b:00.0": {skip: "no nics[] entry selects it"}, "0000:b1:00.0": {skip: "no nics[] entry selects it"},
		},
	}, {
		name: "named by netdev: offered, by the rule that names it",
		yaml: header + "nics:\n- mode: shared\n- select: {names: [eno1]}\n  mode: exclusive\n",
		want: map[string]outcome{
			"0000:17:00.0": {mode: ModeShared}, "0000:31:00.0": {mode: ModeExclusive, rule: 1}, "0000:32:00.0": skipNoVFs,
			"0000:4b:00.0": skipNoNetdev, "0000:b1:00.0": {mode: ModeShared},
		},
	}, {
		name: "named by PCI address",
		yaml: header + "nics:\n- select: {pciAddresses: [\"31:00.0\"]}\n",
		want: map[string]outcome{
			"0000:17:00.0": {skip: "no nics[] entry"}, "0000:31:00.0": {mode: ModeShared}, "0000:32:00.0": {skip: "no nics[] entry"},
			"0000:4b:00.0": {skip: "no nics[] entry"}, "0000:b1:00.0": {skip: "no nics[] entry"},
		},
	}, {
		name: "first match wins; disabled leaves out; fields AND, list entries OR",
		yaml: header + `nics:
- select: {names: [ens2f0]}
  mode: disabled
- select: {vendorIDs: ["15b3"], drivers: [ice, mlx5_core]}
  mode: exclusive
- mode: shared
`,
		want: map[string]outcome{
			"0000:17:00.0": {mode: ModeExclusive, rule: 1}, "0000:31:00.0": skipRoute, "0000:32:00.0": skipNoVFs,
			"0000:4b:00.0": skipNoNetdev, "0000:b1:00.0": {skip: "mode disabled by nics[0]"},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load("")
			if tc.yaml != "" {
				c, err = Parse([]byte(tc.yaml))
			}
			if err != nil {
				t.Fatal(err)
			}
			offers, skips := c.Resolve(testPFs())
			got := map[string]outcome{}
			for _, o := range offers {
				got[o.PF.PCIAddress] = outcome{mode: o.Mode, rule: o.Rule}
				if o.Bandwidth != DefaultBandwidth {
					t.Errorf("%s: policy %+v", o.PF.PCIAddress, o.Bandwidth)
				}
			}
			for _, s := range skips {
				got[s.PCIAddress] = outcome{skip: s.Reason}
			}
			if len(got) != len(testPFs()) {
				t.Errorf("%d PFs decided, want %d", len(got), len(testPFs()))
			}
			for addr, w := range tc.want {
				g := got[addr]
				if w.skip != "" {
					if !strings.Contains(g.skip, w.skip) {
						t.Errorf("%s: got %+v, want skipped for %q", addr, g, w.skip)
					}
					continue
				}
				if g != w {
					t.Errorf("%s: got %+v, want %+v", addr, g, w)
				}
			}
		})
	}
}

func TestResolveCarriesPolicyAndPF(t *testing.T) {
	t.Parallel()
	c, err := Parse([]byte(header + "nics:\n- select: {names: [ens1f0]}\n  bandwidth: {default: 50G, step: 25G}\n"))
	if err != nil {
		t.Fatal(err)
	}
	offers, _ := c.Resolve(testPFs())
	want := NICOffer{PF: testPFs()[0], Mode: ModeShared, Rule: 0, Bandwidth: BandwidthPolicy{DefaultMbps: 50000, MinimumMbps: 25000, StepMbps: 25000}}
	if len(offers) != 1 || !reflect.DeepEqual(offers[0], want) {
		t.Errorf("offers %+v\nwant [%+v]", offers, want)
	}
}

func TestSkipString(t *testing.T) {
	t.Parallel()
	if s := SkipPF(testPFs()[0], "link is down").String(); s != "0000:17:00.0 (ens1f0): link is down" {
		t.Error(s)
	}
	if s := SkipPF(testPFs()[3], "x").String(); s != "0000:4b:00.0: x" {
		t.Error(s)
	}
}
