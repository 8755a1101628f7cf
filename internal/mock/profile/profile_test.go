// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package profile

import (
	"strings"
	"testing"
)

func TestGPUGroupValidate(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown model", "gpus: [{model: x100, count: 1}]",
			`gpus[0].model: unknown GPU model "x100" (known: a100-40gb, a100-80gb, a30-24gb, b200-180gb, h100-80gb, h200-141gb)`},
		{"no count", "gpus: [{model: h100-80gb}]", "gpus[0].count: must be at least 1"},
		{"bus IDs vs count", `gpus: [{model: h100-80gb, count: 8, pciBusIDs: ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]}]`,
			"gpus[0].pciBusIDs: has 3 entries, count is 8"},
		{"bad bus ID", `gpus: [{model: h100-80gb, count: 1, pciBusIDs: ["00000000:1B:00.0"]}]`,
			`gpus[0].pciBusIDs[0]: "00000000:1B:00.0" is not a lower-case PCI address`},
		{"duplicate bus ID", `gpus: [{model: h100-80gb, count: 2, pciBusIDs: ["0000:1b:00.0", "0000:1b:00.0"]}]`,
			"gpus[0].pciBusIDs[1]: 0000:1b:00.0 is also pciBusIDs[0]"},
		{"NUMA vs count", "gpus: [{model: h100-80gb, count: 2, numaNodes: [0]}]", "gpus[0].numaNodes: has 1 entries, count is 2"},
		{"bad NUMA", "gpus: [{model: h100-80gb, count: 1, numaNodes: [-2]}]", "gpus[0].numaNodes[0]: -2 is not a NUMA node"},
		{"instances without MIG", "gpus: [{model: h100-80gb, count: 1, migInstances: [{profile: 3g.40gb}]}]",
			"gpus[0].migInstances: need mig: true"},
		{"unknown profile", "gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.40gb}, {profile: 9g.1gb}]}]",
			`gpus[0].migInstances[1]: profile "9g.1gb" not offered by h100-80gb (offered: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)`},
		{"A100 name on H100", "gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.20gb}]}]",
			`profile "3g.20gb" not offered by h100-80gb`},
		{"start not a placement", "gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.40gb, start: 3}]}]",
			"gpus[0].migInstances[0]: start 3 is not a placement of 3g.40gb on h100-80gb (starts: 0 4)"},
		{"overlap", "gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.40gb}, {profile: 1g.10gb, start: 2}]}]",
			"gpus[0].migInstances[1]: 1g.10gb at 2 overlaps migInstances[0] (3g.40gb at 0)"},
		{"instance count", "gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 1g.10gb+me}, {profile: 1g.10gb+me, start: 1}]}]",
			"gpus[0].migInstances[1]: no room for 1g.10gb+me on h100-80gb (at most 1 instances"},
		{"bad virtualization", "gpus: [{model: h100-80gb, count: 1, virtualization: vgpu}]",
			`gpus[0].virtualization: unknown mode "vgpu" (known: none, host-vgpu, passthrough)`},
		{"framework without vGPU", "gpus: [{model: h100-80gb, count: 1, vgpuFramework: vfio}]",
			"gpus[0].vgpuFramework: needs virtualization: host-vgpu"},
		{"unknown framework", "gpus: [{model: h100-80gb, count: 1, virtualization: host-vgpu, vgpuFramework: iommufd}]",
			`gpus[0].vgpuFramework: unknown framework "iommufd" (known: mdev, vfio)`},
		{"VFIO framework on Ampere", "gpus: [{model: a100-80gb, count: 1, virtualization: host-vgpu, vgpuFramework: vfio}]",
			"gpus[0].vgpuFramework: a100-80gb has no vendor-specific VFIO framework"},
		{"passthrough with MIG", "gpus: [{model: h100-80gb, count: 1, virtualization: passthrough, mig: true}]",
			"gpus[0].mig: a GPU bound to vfio-pci (virtualization: passthrough) has no MIG mode"},
		{"passthrough with vGPU types", "gpus: [{model: h100-80gb, count: 1, virtualization: passthrough, vgpuTypes: [{name: x, framebufferMB: 1, maxInstances: 1}]}]",
			"gpus[0].vgpuTypes: need virtualization: host-vgpu"},
		{"types without vGPU", "gpus: [{model: h100-80gb, count: 1, vgpuTypes: [{name: x, framebufferMB: 1, maxInstances: 1}]}]",
			"gpus[0].vgpuTypes: need virtualization: host-vgpu"},
		{"heterogeneous on Ampere", "gpus: [{model: a100-40gb, count: 1, virtualization: host-vgpu, vgpuHeterogeneous: true}]",
			"gpus[0].vgpuHeterogeneous: a100-40gb has no heterogeneous vGPU mode"},
		{"vGPU type profile", "gpus: [{model: h100-80gb, count: 1, virtualization: host-vgpu, vgpuTypes: [{name: x, framebufferMB: 1, maxInstances: 1, migProfile: 1g.5gb}]}]",
			`gpus[0].vgpuTypes[0].migProfile: "1g.5gb" not offered by h100-80gb`},
		{"vGPU type size", "gpus: [{model: h100-80gb, count: 1, virtualization: host-vgpu, vgpuTypes: [{name: x, maxInstances: 1}]}]",
			"gpus[0].vgpuTypes[0].framebufferMB: must be more than 0"},
		{"unknown field", "gpus: [{model: h100-80gb, count: 1, colour: green}]", `unknown field "gpus[0].colour"`},
		{"wrong type", "gpus: [{model: h100-80gb, count: many}]", `gpus[0].count: Invalid value: "many": must be an integer`},
		{"more GPUs than default addresses", "gpus: [{model: h100-80gb, count: 30}, {model: a100-40gb, count: 3}]",
			"gpus: 33 GPUs without pciBusIDs, the mock has default PCI addresses for 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("t", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse: got error %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

func TestGPUGroupValidateAccepts(t *testing.T) {
	for _, y := range []string{
		"gpus: [{model: a30-24gb, count: 1, mig: true, migInstances: [{profile: 2g.12gb+me}, {profile: 1g.6gb, start: 2}]}]",
		"gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 4g.40gb}, {profile: 2g.20gb, start: 4}, {profile: 1g.10gb, start: 6}]}]",
		"gpus: [{model: h100-80gb, count: 2, virtualization: host-vgpu, vgpuTypes: [{name: NVIDIA H100-1-10C, framebufferMB: 9984, maxInstances: 7, migProfile: 1g.10gb}]}]",
		"gpus: [{model: h100-80gb, count: 30}, {model: a100-40gb, count: 2}, {model: a30-24gb, count: 1, pciBusIDs: [\"0000:05:00.0\"]}]",
	} {
		if _, err := Parse("t", []byte(y)); err != nil {
			t.Errorf("Parse(%s): %v", y, err)
		}
	}
}

func TestNICGroupValidate(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown model", "nics: [{model: cx9, count: 1}]", `nics[0].model: unknown NIC model "cx9" (known: cx6, cx7, e810)`},
		{"no count", "nics: [{model: cx7}]", "nics[0].count: must be at least 1"},
		{"too many VFs", "nics: [{model: cx7, count: 1, vfs: 20, totalVFs: 16}]", "nics[0].vfs: 20 is more than sriov_totalvfs (16)"},
		{"negative VFs", "nics: [{model: cx7, count: 1, vfs: -1}]", "nics[0].vfs: must not be negative"},
		{"VFs beyond the bus", "nics: [{model: cx7, count: 1, totalVFs: 300}]", "nics[0].totalVFs: at most 248"},
		{"addresses vs count", `nics: [{model: cx7, count: 2, pciAddresses: ["0000:17:00.0"]}]`, "nics[0].pciAddresses: has 1 entries, count is 2"},
		{"bad address", `nics: [{model: cx7, count: 1, pciAddresses: ["0000:17:00.0x"]}]`, `nics[0].pciAddresses[0]: "0000:17:00.0x" is not a lower-case PCI address`},
		{"duplicate address", `nics: [{model: cx7, count: 2, pciAddresses: ["0000:17:00.0", "0000:17:00.0"]}]`, "nics[0].pciAddresses[1]: 0000:17:00.0 appears twice"},
		{"bad root", `nics: [{model: cx7, count: 1, pcieRoots: ["0000:16"]}]`, `nics[0].pcieRoots[0]: "0000:16" is not a PCIe root`},
		{"bad NUMA", "nics: [{model: cx7, count: 1, numaNodes: [-2]}]", "nics[0].numaNodes[0]: -2 is not a NUMA node"},
		{"netdev too long for VF names", `nics: [{model: cx7, count: 1, netdevs: ["enp23s0f0np0x"]}]`, `nics[0].netdevs[0]: "enp23s0f0np0x" must be at most 11 characters`},
		{"vf driver", "nics: [{model: e810, count: 1, vfDriver: mlx5_core}]", `nics[0].vfDriver: "mlx5_core" is not iavf, vfio-pci or none`},
		{"default route index", "nics: [{model: cx7, count: 2, defaultRoute: 2}]", "nics[0].defaultRoute: 2 is not a PF index of this group (0-1)"},
		{"no InfiniBand on E810", "nics: [{model: e810, count: 1, linkType: infiniband}]", `nics[0].linkType: e810 has no "infiniband" link`},
		{"eswitch", "nics: [{model: cx7, count: 1, eswitchMode: offload}]", `nics[0].eswitchMode: "offload" is not legacy, switchdev or none`},
		{"MTU", "nics: [{model: e810, count: 1, mtu: 9978}]", "nics[0].mtu: 9978 is outside 68-9702"},
		{"unknown field", "nics: [{model: cx7, count: 1, speed: 1}]", `unknown field "nics[0].speed"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("t", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestTimingsValidation(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"gpus: [{model: h100-80gb, count: 1, timings: {createGpuInstance: soon}}]", `gpus[0].timings.createGpuInstance: "soon" is not a duration`},
		{"gpus: [{model: h100-80gb, count: 1, timings: {setVF: 1s}}]", `unknown field "gpus[0].timings.setVF"`},
		{"nics: [{model: cx7, count: 1, timings: {setVF: -1s}}]", `nics[0].timings.setVF: "-1s" is not a duration`},
	} {
		if _, err := Parse("t", []byte(tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s): %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

func TestRDMANetnsValidation(t *testing.T) {
	if _, err := Parse("x", []byte(`rdmaNetns: private
nics: [{model: cx7, count: 1}]`)); err == nil {
		t.Error("rdmaNetns: private accepted")
	}
}

// TestBuiltins: every built-in profile loads by name; an unknown name
// lists them.
func TestBuiltins(t *testing.T) {
	names := Builtins()
	want := []string{"cx7", "dgx-a100", "dgx-h100", "dgx-h200", "h100-mig", "h100-vgpu", "h100-vm"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("built-in profiles %v, want %v", names, want)
	}
	for _, name := range names {
		if p, err := Load(name); err != nil || p.Name != name {
			t.Errorf("Load(%s): %s, %v", name, p.Name, err)
		}
	}
	if _, err := Load("nope"); err == nil || !strings.Contains(err.Error(), "dgx-h100") {
		t.Errorf("unknown profile: %v", err)
	}
}

// TestParseOrLoad: YAML is parsed under the given name, anything else is
// loaded as a built-in name or a file.
func TestParseOrLoad(t *testing.T) {
	for _, tc := range []struct{ spec, name, err string }{
		{"nics: [{model: cx7, count: 1}]", "inline", ""},
		{"cx7", "cx7", ""},
		{"nics: [{model: cx9, count: 1}]", "", `mock profile "inline": nics[0].model`},
		{"/nonexistent/p.yaml", "", "no such file"},
	} {
		p, err := ParseOrLoad("inline", tc.spec)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want an error containing %q", tc.spec, err, tc.err)
		case tc.err == "" && (err != nil || p.Name != tc.name):
			t.Errorf("%s: profile %q, %v; want %q", tc.spec, p.Name, err, tc.name)
		}
	}
}

// TestParseReportsEveryProblem: a profile with a problem in each of two
// GPU groups, one in a NIC group and a bad rdmaNetns says all four.
func TestParseReportsEveryProblem(t *testing.T) {
	_, err := Parse("bad", []byte(`rdmaNetns: sometimes
gpus:
- {model: h100-80gb, count: 0}
- {model: h100-80gb, count: 1, migInstances: [{profile: 9g.99gb, start: 0}]}
nics:
- {model: cx7, count: 1, vfs: -1}
`))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		`rdmaNetns: "sometimes" is not`,
		"gpus[0].count: must be at least 1, is 0",
		"gpus[1].migInstances: need mig: true",
		"nics[0].vfs: must not be negative",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
