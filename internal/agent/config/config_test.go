// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	configv1alpha1 "github.com/hwdra/hwdra/api/config/v1alpha1"
	"github.com/hwdra/hwdra/internal/hw"
)

const header = "apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\n"

func TestParseValid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		yaml string
		want []rule
	}{{
		name: "no nics: the built-in rule, as without a file",
		yaml: header,
		want: []rule{{index: -1, mode: ModeShared, bandwidth: DefaultBandwidth}},
	}, {
		name: "only health: nics keeps its default",
		yaml: header + "health: {fatalEffect: NoExecute}\n",
		want: []rule{{index: -1, mode: ModeShared, bandwidth: DefaultBandwidth}},
	}, {
		name: "bandwidth as bare numbers, as Kubernetes takes quantities",
		yaml: header + "nics:\n- bandwidth: {default: 25000000000, minimum: 5e9, step: 5000000000}\n",
		want: []rule{{index: 0, mode: ModeShared, bandwidth: BandwidthPolicy{DefaultMbps: 25000, MinimumMbps: 5000, StepMbps: 5000}}},
	}, {
		name: "catch-all with the built-in policy",
		yaml: header + "nics:\n- {}\n",
		want: []rule{{index: 0, mode: ModeShared, bandwidth: DefaultBandwidth}},
	}, {
		name: "selectors normalised",
		yaml: header + `nics:
- select:
    names: [ens1f0np0]
    pciAddresses: ["0000:17:00.0", "B1:00.1"]
    vendorIDs: ["0x15B3"]
    deviceIDs: ["1021"]
    drivers: [mlx5_core]
  mode: exclusive
`,
		want: []rule{{index: 0, mode: ModeExclusive, bandwidth: DefaultBandwidth, sel: configv1alpha1.PFSelector{
			Names: []string{"ens1f0np0"}, PCIAddresses: []string{"0000:17:00.0", "0000:b1:00.1"},
			VendorIDs: []string{"15b3"}, DeviceIDs: []string{"1021"}, Drivers: []string{"mlx5_core"},
		}}},
	}, {
		name: "full bandwidth policy",
		yaml: header + "nics:\n- bandwidth: {default: 25G, minimum: 5G, step: 5G}\n",
		want: []rule{{index: 0, mode: ModeShared, bandwidth: BandwidthPolicy{DefaultMbps: 25000, MinimumMbps: 5000, StepMbps: 5000}}},
	}, {
		name: "step only: minimum is the step, default rounds up to it",
		yaml: header + "nics:\n- bandwidth: {step: 4G}\n",
		want: []rule{{index: 0, mode: ModeShared, bandwidth: BandwidthPolicy{DefaultMbps: 12000, MinimumMbps: 4000, StepMbps: 4000}}},
	}, {
		name: "minimum only: shares are its multiples",
		yaml: header + "nics:\n- bandwidth: {minimum: 500M}\n",
		want: []rule{{index: 0, mode: ModeShared, bandwidth: BandwidthPolicy{DefaultMbps: 10000, MinimumMbps: 500, StepMbps: 500}}},
	}, {
		name: "minimum above the built-in default",
		yaml: header + "nics:\n- bandwidth: {minimum: 40G, step: 10G}\n",
		want: []rule{{index: 0, mode: ModeShared, bandwidth: BandwidthPolicy{DefaultMbps: 40000, MinimumMbps: 40000, StepMbps: 10000}}},
	}, {
		name: "decimal quantities",
		yaml: header + "nics:\n- bandwidth: {default: 2.5G, minimum: 500M, step: 0.5G}\n",
		want: []rule{{index: 0, mode: ModeShared, bandwidth: BandwidthPolicy{DefaultMbps: 2500, MinimumMbps: 500, StepMbps: 500}}},
	}, {
		name: "disabled, then the rest",
		yaml: header + "nics:\n- select: {names: [eth0]}\n  mode: disabled\n- mode: shared\n",
		want: []rule{
			{index: 0, mode: ModeDisabled, bandwidth: DefaultBandwidth, sel: configv1alpha1.PFSelector{Names: []string{"eth0"}, PCIAddresses: []string{}, VendorIDs: []string{}, DeviceIDs: []string{}, Drivers: []string{}}},
			{index: 1, mode: ModeShared, bandwidth: DefaultBandwidth},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			// Empty lists and nil lists select alike.
			for i := range c.rules {
				c.rules[i].sel = canon(c.rules[i].sel)
			}
			for i := range tc.want {
				tc.want[i].sel = canon(tc.want[i].sel)
			}
			if !reflect.DeepEqual(c.rules, tc.want) {
				t.Errorf("rules:\n got %+v\nwant %+v", c.rules, tc.want)
			}
		})
	}
}

func canon(s configv1alpha1.PFSelector) configv1alpha1.PFSelector {
	for _, l := range []*[]string{&s.Names, &s.PCIAddresses, &s.VendorIDs, &s.DeviceIDs, &s.Drivers} {
		if len(*l) == 0 {
			*l = nil
		}
	}
	return s
}

// TestParseInvalid: every bad field is an error that names it, and a file
// with an error gives no configuration.
func TestParseInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, yaml, want string }{
		{"empty file", "", "empty document"},
		{"no apiVersion", "kind: AgentConfig\n", "apiVersion: Required value"},
		{"wrong apiVersion", "apiVersion: config.hwdra.io/v2\nkind: AgentConfig\n", `apiVersion: Unsupported value: "config.hwdra.io/v2": supported values: "config.hwdra.io/v1alpha1"`},
		{"wrong kind", "apiVersion: config.hwdra.io/v1alpha1\nkind: Config\n", `kind: Unsupported value: "Config": supported values: "AgentConfig"`},
		{"another hwdra kind", "apiVersion: gpu.hwdra.io/v1alpha1\nkind: GpuConfig\n", "kind GpuConfig (gpu.hwdra.io/v1alpha1) is no agent configuration: want kind AgentConfig, apiVersion config.hwdra.io/v1alpha1"},
		{"unknown top-level field", header + "gpu: {}\n", `unknown field "gpu"`},
		{"unknown nested field", header + "nics:\n- {}\n- bandwidth: {stp: 1G}\n", `unknown field "nics[1].bandwidth.stp"`},
		{"case matters", header + "nics:\n- Mode: shared\n", `unknown field "nics[0].Mode"`},
		{"duplicate key", header + "nics: []\nnics: []\n", `line 4: key "nics" already set in map`},
		{"nics not a list", header + "nics: {mode: shared}\n", "nics: Invalid value: must be a list, not an object"},
		{"select not an object", header + "nics:\n- select: eth0\n", `nics[0].select: Invalid value: "eth0": must be an object`},
		{"unquoted device ID", header + "nics:\n- select: {deviceIDs: [1021]}\n", "nics[0].select.deviceIDs[0]: Invalid value: 1021: must be a string (quote it)"},
		{"mode", header + "nics:\n- mode: dedicated\n", `nics[0].mode: Unsupported value: "dedicated": supported values: "shared", "exclusive", "disabled"`},
		{"name", header + "nics:\n- select: {names: [\"\"]}\n", `nics[0].select.names[0]: Invalid value: "": must be a netdev name`},
		{"long name", header + "nics:\n- select: {names: [enp23s0f0np0v127]}\n", `nics[0].select.names[0]: Invalid value: "enp23s0f0np0v127": must be a netdev name`},
		{"address", header + "nics:\n- select: {pciAddresses: [\"0000:17:00\"]}\n", `nics[0].select.pciAddresses[0]: Invalid value: "0000:17:00": must be a PCI address like 0000:17:00.0`},
		{"vendor", header + "nics:\n- select: {vendorIDs: [\"15b\"]}\n", `nics[0].select.vendorIDs[0]: Invalid value: "15b": must be four hex digits`},
		{"device", header + "nics:\n- select: {deviceIDs: [\"xyz1\"]}\n", `nics[0].select.deviceIDs[0]: Invalid value: "xyz1": must be four hex digits`},
		{"driver", header + "nics:\n- select: {drivers: [\"mlx5 core\"]}\n", `nics[0].select.drivers[0]: Invalid value: "mlx5 core": must be a kernel driver name`},
		{"bandwidth in exclusive mode", header + "nics:\n- mode: exclusive\n  bandwidth: {default: 1G}\n", "nics[0].bandwidth: Forbidden: only applies to mode shared"},
		{"step zero", header + "nics:\n- {}\n- bandwidth: {step: \"0\"}\n", `nics[1].bandwidth.step: Invalid value: "0": must be > 0`},
		{"negative minimum", header + "nics:\n- bandwidth: {minimum: -1G}\n", `nics[0].bandwidth.minimum: Invalid value: "-1G": must be > 0`},
		{"not a quantity", header + "nics:\n- bandwidth: {default: 10Gbps}\n", `nics[0].bandwidth.default: Invalid value: "10Gbps": must be a quantity in bits per second`},
		{"empty nics", header + "nics: []\n", "nics: Invalid value: an empty list would offer no PF: leave nics out"},
		{"step 0 as a number", header + "nics:\n- bandwidth: {step: 0}\n", `nics[0].bandwidth.step: Invalid value: "0": must be > 0`},
		{"a number of bits", header + "nics:\n- bandwidth: {default: 10}\n", `nics[0].bandwidth.default: Invalid value: "10": must be a whole number of Mb/s`},
		{"a list for a quantity", header + "nics:\n- bandwidth: {minimum: [1G]}\n", `nics[0].bandwidth.minimum: Invalid value: "[\"1G\"]": must be a quantity in bits per second`},
		{"binary suffix", header + "nics:\n- bandwidth: {step: 1Gi}\n", `nics[0].bandwidth.step: Invalid value: "1Gi": must be a whole number of Mb/s`},
		{"below 1 Mb/s", header + "nics:\n- bandwidth: {minimum: 100k}\n", `nics[0].bandwidth.minimum: Invalid value: "100k": must be a whole number of Mb/s`},
		{"absurd", header + "nics:\n- bandwidth: {default: 1E}\n", `nics[0].bandwidth.default: Invalid value: "1E": must be at most 100T`},
		{"default below minimum", header + "nics:\n- bandwidth: {default: 1G, minimum: 2G}\n", `nics[0].bandwidth.default: Invalid value: "1G": must be at least the minimum (2G)`},
		{"default off the step", header + "nics:\n- bandwidth: {default: 10G, minimum: 1G, step: 2G}\n",
			`nics[0].bandwidth.default: Invalid value: "10G": must be the minimum (1G) plus a multiple of the step (2G)`},
		{"device plugin resource", header + "devicePlugin:\n  resources: [gpu]\n", `devicePlugin.resources[0]: Invalid value: "gpu": must be a domain-prefixed name like nvidia.com/gpu`},
		{"device plugin wildcard inside", header + "devicePlugin:\n  resources: [\"nvidia.com/*-x\"]\n", `devicePlugin.resources[0]: Invalid value: "nvidia.com/*-x": "*" may only end a prefix`},
		{"owned GPU address", header + "devicePlugin:\n  ownedGPUs: {pciAddresses: [gpu0]}\n", `devicePlugin.ownedGPUs.pciAddresses[0]: Invalid value: "gpu0": must be a PCI address`},
		{"owned GPU index for a UUID", header + "devicePlugin:\n  ownedGPUs: {uuids: [\"0\"]}\n", `devicePlugin.ownedGPUs.uuids[0]: Invalid value: "0": must be a GPU UUID`},
		{"owned GPUs unknown field", header + "devicePlugin:\n  ownedGPUs: {indices: [0]}\n", `unknown field "devicePlugin.ownedGPUs.indices"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			if c != nil {
				t.Error("a configuration came back with the error")
			}
		})
	}
}

func TestParseReportsEveryError(t *testing.T) {
	t.Parallel()
	_, err := Parse([]byte(header + "nics:\n- mode: x\n- bandwidth: {step: \"0\"}\n"))
	for _, want := range []string{"nics[0].mode:", "nics[1].bandwidth.step:"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %s", err, want)
		}
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	c, err := Load("")
	if err != nil || !reflect.DeepEqual(c, Default()) {
		t.Errorf("Load(\"\") = %+v, %v; want the default", c, err)
	}
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("a missing file given explicitly must be an error, not the default")
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(header+"nics:\n- mode: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), "config "+bad+": nics[0].mode: Unsupported value") {
		t.Errorf("Load(bad) = %v; want the path and the field", err)
	}
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(header+"nics:\n- mode: exclusive\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err := Load(good); err != nil || len(c.rules) != 1 || c.rules[0].mode != ModeExclusive {
		t.Errorf("Load(good) = %+v, %v", c, err)
	}
}

// TestExample keeps the shipped example valid and meaning what it says.
func TestExample(t *testing.T) {
	t.Parallel()
	c, err := Load("../../../api/config/v1alpha1/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []Mode{ModeDisabled, ModeShared, ModeExclusive}
	if len(c.rules) != len(want) {
		t.Fatalf("%d rules", len(c.rules))
	}
	for i, m := range want {
		if c.rules[i].mode != m {
			t.Errorf("nics[%d].mode = %s, want %s", i, c.rules[i].mode, m)
		}
	}
	if p := c.rules[1].bandwidth; p != (BandwidthPolicy{DefaultMbps: 25000, MinimumMbps: 5000, StepMbps: 5000}) {
		t.Errorf("policy %+v", p)
	}
	if h := c.HealthPolicy(); !h.FatalNoExecute || len(h.IgnoreXIDs) != 1 || h.IgnoreXIDs[0] != 63 || len(h.ReportXIDs) != 1 || h.ReportXIDs[0] != 43 {
		t.Errorf("health %+v", h)
	}
	if !c.DevicePluginResource("nvidia.com/mig-1g.10gb") || c.devicePlugin.owned != nil {
		t.Errorf("devicePlugin %+v", c.devicePlugin)
	}
	if g := c.GPUPolicy(); g.OffersMIGProfile("1g.10gb+me") || !g.OffersMIGProfile("1g.10gb") || g.Settings() != SettingsManage {
		t.Errorf("gpus %+v", g)
	}
	cx7 := hw.PF{VendorID: "15b3", DeviceID: "1021"}
	if p := c.VFPolicy(cx7); !p.AllowsVLAN(0) || !p.AllowsVLAN(150) || p.AllowsVLAN(200) || !p.MAC || p.Trust || p.SpoofCheckOff || p.GUIDs {
		t.Errorf("the ConnectX-7's vfPolicy %+v", p)
	}
	if p := c.VFPolicy(hw.PF{VendorID: "8086"}); p.AllowsVLAN(0) || !p.AllowsVLAN(199) || p.MAC {
		t.Errorf("another PF's vfPolicy %+v", p)
	}
	if c.AllowsUnsafeNoIOMMU() {
		t.Error("vfio.allowUnsafeNoIOMMU")
	}
}

// TestDevicePluginResources: the default names and prefixes, and a
// file's own.
func TestDevicePluginResources(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		yaml string
		yes  []string
		no   []string
	}{{
		name: "no file",
		yes:  []string{"nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-7g.80gb"},
		no:   []string{"nvidia.com/gpu-x", "nvidia.com/mig", "amd.com/gpu", "deviceclass.resource.kubernetes.io/gpu.hwdra.io"},
	}, {
		name: "section without resources: the defaults",
		yaml: header + "devicePlugin: {}\n",
		yes:  []string{"nvidia.com/gpu", "nvidia.com/mig-2g.20gb"},
		no:   []string{"example.com/gpu"},
	}, {
		name: "a file's own names replace the defaults",
		yaml: header + "devicePlugin:\n  resources: [example.com/gpu, \"example.com/part-*\"]\n",
		yes:  []string{"example.com/gpu", "example.com/part-a"},
		no:   []string{"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "example.com/part"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseOrDefault(t, tc.yaml)
			for _, r := range tc.yes {
				if !c.DevicePluginResource(r) {
					t.Errorf("%s is not taken for the device plugin's", r)
				}
			}
			for _, r := range tc.no {
				if c.DevicePluginResource(r) {
					t.Errorf("%s is taken for the device plugin's", r)
				}
			}
		})
	}
}

// TestOwnGPUs: without a split the agent owns every GPU while the device
// plugin is away and none while it serves; with devicePlugin.ownedGPUs
// exactly those, by PCI address or UUID, either way.
func TestOwnGPUs(t *testing.T) {
	t.Parallel()
	gpus := []hw.GPU{
		{PCIBusID: "0000:1b:00.0", UUID: "GPU-00000000-0000-4000-8000-000000000001"},
		{PCIBusID: "0000:43:00.0", UUID: "GPU-00000000-0000-4000-8000-000000000002"},
		{PCIBusID: "0000:52:00.0", UUID: "GPU-00000000-0000-4000-8000-000000000003"},
	}
	split := header + `devicePlugin:
  ownedGPUs:
    pciAddresses: ["1B:00.0"]
    uuids: [GPU-00000000-0000-4000-8000-000000000003]
`
	for _, tc := range []struct {
		name      string
		yaml      string
		serves    bool
		own, left []string
		why       string
	}{
		{name: "no device plugin", own: []string{"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0"}},
		{name: "the device plugin serves: all left", serves: true, left: []string{"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0"},
			why: "NVIDIA's device plugin serves GPUs on this node"},
		{name: "split, device plugin away", yaml: split, own: []string{"0000:1b:00.0", "0000:52:00.0"}, left: []string{"0000:43:00.0"},
			why: "devicePlugin.ownedGPUs leaves them to NVIDIA's device plugin"},
		{name: "split, device plugin serves", yaml: split, serves: true, own: []string{"0000:1b:00.0", "0000:52:00.0"}, left: []string{"0000:43:00.0"},
			why: "devicePlugin.ownedGPUs leaves them to NVIDIA's device plugin"},
		{name: "split owning every GPU", yaml: header + "devicePlugin:\n  ownedGPUs: {pciAddresses: [1b:00.0, 43:00.0, 52:00.0]}\n", serves: true,
			own: []string{"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0"}},
		{name: "empty split: every GPU the plugin's", yaml: header + "devicePlugin:\n  ownedGPUs: {}\n",
			left: []string{"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0"}, why: "devicePlugin.ownedGPUs leaves them to NVIDIA's device plugin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseOrDefault(t, tc.yaml)
			own, left, why := c.OwnGPUs(gpus, tc.serves)
			addrs := func(gs []hw.GPU) []string {
				var out []string
				for _, g := range gs {
					out = append(out, g.PCIBusID)
				}
				return out
			}
			if got := addrs(own); !reflect.DeepEqual(got, tc.own) {
				t.Errorf("own %v, want %v", got, tc.own)
			}
			if got := addrs(left); !reflect.DeepEqual(got, tc.left) {
				t.Errorf("left %v, want %v", got, tc.left)
			}
			if why != tc.why {
				t.Errorf("why %q, want %q", why, tc.why)
			}
		})
	}
}

// parseOrDefault parses a file's content; none: Default.
func parseOrDefault(t *testing.T, yaml string) *AgentConfig {
	t.Helper()
	if yaml == "" {
		return Default()
	}
	c, err := Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return c
}
