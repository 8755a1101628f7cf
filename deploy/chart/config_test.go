// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common/util"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/internal/agent/config"
)

// chartDir is the chart's sources, as deploy embeds them.
const chartDir = "../helm/hwdra"

// configCase is a set of the chart's values (YAML) around a config.
type configCase struct {
	name   string
	values string
	// render: a bad config that values.schema.json cannot refuse (the
	// rule spans fields, or counts bytes where the schema counts
	// characters) and a template refuses with this text instead.
	render string
	// gap: why neither the schema nor a template can refuse this bad
	// config; the agent refuses it at start, naming the field.
	gap string
}

// quantityGap: JSON schema compares numbers, not Kubernetes quantities
// ("1.5G", "512Mi"), and helm's templates have no quantity parser. The
// schema checks a quantity's form and, written as a number, its bounds.
const quantityGap = "the bounds of a quantity written as a string need its value"

// badConfigs: each refusal of AgentConfig's validation
// (api/config/v1alpha1/validation.go), its decoding (unknown fields,
// wrong types) and the chart's wrapping of it.
var badConfigs = []configCase{
	// Decoding: unknown fields at every level, wrong types.
	{name: "unknown field", values: "config: {nic: []}"},
	{name: "unknown nics field", values: "config: {nics: [{selector: {}}]}"},
	{name: "unknown select field", values: "config: {nics: [{select: {name: [eth0]}}]}"},
	{name: "unknown gpus field", values: "config: {gpus: {mig: {}}}"},
	{name: "unknown vfPolicy.pfs field", values: "config: {vfPolicy: {pfs: [{allowVLANs: [1]}]}}"},
	{name: "kind in config", values: "config: {kind: Other}"},
	{name: "nics not a list", values: "config: {nics: {mode: shared}}"},
	{name: "names not a list", values: "config: {nics: [{select: {names: eth0}}]}"},
	{name: "mode a number", values: "config: {nics: [{mode: 1}]}"},
	{name: "bandwidth a bool", values: "config: {nics: [{bandwidth: {default: true}}]}"},
	{name: "fatalEffect a list", values: "config: {health: {fatalEffect: [NoExecute]}}"},
	{name: "xid negative", values: "config: {health: {xids: {ignore: [-1]}}}"},
	{name: "xid a string", values: "config: {health: {xids: {report: [\"43\"]}}}"},
	{name: "allowTrust a string", values: "config: {vfPolicy: {allowTrust: \"yes\"}}"},
	{name: "checkInterval a string", values: "config: {gpus: {shares: {checkIntervalMilliseconds: \"1000\"}}}"},
	{name: "checkInterval a fraction", values: "config: {gpus: {shares: {checkIntervalMilliseconds: 150.5}}}"},
	{name: "resources a string", values: "config: {devicePlugin: {resources: nvidia.com/gpu}}"},
	{name: "allowUnsafeNoIOMMU a number", values: "config: {vfio: {allowUnsafeNoIOMMU: 1}}"},
	{name: "shmSize a list", values: "config: {gpus: {mps: {shmSize: [1Gi]}}}"},
	// nics
	{name: "nics empty", values: "config: {nics: []}"},
	{name: "mode unknown", values: "config: {nics: [{mode: bridge}]}"},
	{name: "bandwidth in exclusive mode", values: "config: {nics: [{mode: exclusive, bandwidth: {step: 1G}}]}"},
	{name: "bandwidth in disabled mode", values: "config: {nics: [{mode: disabled, bandwidth: {}}]}"},
	{name: "bandwidth not a quantity", values: "config: {nics: [{bandwidth: {default: fast}}]}"},
	{name: "bandwidth zero", values: "config: {nics: [{bandwidth: {minimum: 0}}]}"},
	{name: "bandwidth negative", values: "config: {nics: [{bandwidth: {step: -1000000}}]}"},
	{name: "bandwidth not whole Mb/s", values: "config: {nics: [{bandwidth: {step: 1500000.5}}]}"},
	{name: "bandwidth number above 100T", values: "config: {nics: [{bandwidth: {minimum: 200000000000000}}]}"},
	{name: "bandwidth binary", values: "config: {nics: [{bandwidth: {default: 10Gi}}]}", gap: quantityGap},
	{name: "bandwidth string above 100T", values: "config: {nics: [{bandwidth: {minimum: 200T}}]}", gap: quantityGap},
	{name: "default below minimum", values: "config: {nics: [{bandwidth: {default: 1G, minimum: 5G}}]}",
		gap: "default against minimum and step is arithmetic across fields on quantities"},
	{name: "default off the steps", values: "config: {nics: [{bandwidth: {default: 7G, minimum: 5G, step: 5G}}]}",
		gap: "default against minimum and step is arithmetic across fields on quantities"},
	// PF selectors, in nics and in vfPolicy.pfs.
	{name: "name empty", values: "config: {nics: [{select: {names: [\"\"]}}]}"},
	{name: "name of 16 characters", values: "config: {nics: [{select: {names: [abcdefghijklmnop]}}]}"},
	{name: "name of 16 bytes", values: "config: {nics: [{select: {names: [\"éééééééé\"]}}]}",
		render: `config.nics[0].select.names[0]: "éééééééé" is 16 bytes`},
	{name: "name with a colon", values: "config: {nics: [{select: {names: [\"eth0:1\"]}}]}"},
	{name: "name with a slash", values: "config: {vfPolicy: {pfs: [{select: {names: [eth/0]}}]}}"},
	{name: "name with a blank", values: "config: {nics: [{select: {names: [\"eth 0\"]}}]}"},
	{name: "name of 16 bytes in vfPolicy", values: "config: {vfPolicy: {pfs: [{select: {names: [\"ééééééé12\"]}}]}}",
		render: `config.vfPolicy.pfs[0].select.names[0]: "ééééééé12" is 16 bytes`},
	{name: "pci address short", values: "config: {nics: [{select: {pciAddresses: [\"17:00\"]}}]}"},
	{name: "pci address function 8", values: "config: {vfPolicy: {pfs: [{select: {pciAddresses: [\"0000:17:00.8\"]}}]}}"},
	{name: "vendor ID of 3 digits", values: "config: {nics: [{select: {vendorIDs: [\"15b\"]}}]}"},
	{name: "device ID not hex", values: "config: {nics: [{select: {deviceIDs: [\"10g1\"]}}]}"},
	{name: "driver empty", values: "config: {nics: [{select: {drivers: [\"\"]}}]}"},
	{name: "driver with a blank", values: "config: {nics: [{select: {drivers: [\"mlx5 core\"]}}]}"},
	// health
	{name: "fatalEffect unknown", values: "config: {health: {fatalEffect: Evict}}"},
	{name: "xid reported and ignored", values: "config: {health: {xids: {ignore: [63, 43], report: [43]}}}",
		render: "config.health.xids.report[0]: 43 is also in config.health.xids.ignore"},
	// gpus
	{name: "settings lower case", values: "config: {gpus: {settings: leave}}"},
	{name: "claimStatus unknown", values: "config: {gpus: {claimStatus: Sometimes}}"},
	{name: "overuse unknown", values: "config: {gpus: {shares: {overuse: Kill}}}"},
	{name: "checkInterval below 100", values: "config: {gpus: {shares: {checkIntervalMilliseconds: 99}}}"},
	{name: "checkInterval above 60000", values: "config: {gpus: {shares: {checkIntervalMilliseconds: 60001}}}"},
	{name: "migProfiles upper case", values: "config: {gpus: {migProfiles: {include: [1G.10GB]}}}"},
	{name: "migProfiles blank", values: "config: {gpus: {migProfiles: {exclude: [\"1g 10gb\"]}}}"},
	{name: "shmSize not a quantity", values: "config: {gpus: {mps: {shmSize: big}}}"},
	{name: "shmSize number below 1Mi", values: "config: {gpus: {mps: {shmSize: 1024}}}"},
	{name: "shmSize number above 1Ti", values: "config: {gpus: {mps: {shmSize: 2199023255552}}}"},
	{name: "shmSize string below 1Mi", values: "config: {gpus: {mps: {shmSize: 1Ki}}}", gap: quantityGap},
	{name: "shmSize string above 1Ti", values: "config: {gpus: {mps: {shmSize: 2Ti}}}", gap: quantityGap},
	{name: "daemonMemoryLimit not a quantity", values: "config: {gpus: {mps: {daemonMemoryLimit: 4 GB}}}"},
	{name: "daemonMemoryLimit number below 64Mi", values: "config: {gpus: {mps: {daemonMemoryLimit: 1048576}}}"},
	{name: "daemonMemoryLimit string below 64Mi", values: "config: {gpus: {mps: {daemonMemoryLimit: 32Mi}}}", gap: quantityGap},
	// devicePlugin
	{name: "resource without a domain", values: "config: {devicePlugin: {resources: [gpu]}}"},
	{name: "resource in kubernetes.io", values: "config: {devicePlugin: {resources: [kubernetes.io/gpu]}}"},
	{name: "resource in a kubernetes.io subdomain", values: "config: {devicePlugin: {resources: [x.kubernetes.io/gpu]}}"},
	{name: "resource with requests.", values: "config: {devicePlugin: {resources: [requests.nvidia.com/gpu]}}"},
	{name: "resource with a star inside", values: "config: {devicePlugin: {resources: [\"nvidia.com/*-gpu\"]}}"},
	{name: "resource with upper-case domain", values: "config: {devicePlugin: {resources: [NVIDIA.com/gpu]}}"},
	{name: "resource with two slashes", values: "config: {devicePlugin: {resources: [nvidia.com/gpu/x]}}"},
	{name: "resource name of 64", values: "config: {devicePlugin: {resources: [nvidia.com/" + strings.Repeat("g", 64) + "]}}"},
	{name: "resource prefix of 63", values: "config: {devicePlugin: {resources: [\"nvidia.com/" + strings.Repeat("g", 63) + "*\"]}}"},
	{name: "resource domain of 245", values: "config: {devicePlugin: {resources: [" + strings.Repeat("a", 241) + ".com/gpu]}}"},
	{name: "resource name ending in a dash", values: "config: {devicePlugin: {resources: [nvidia.com/gpu-]}}"},
	{name: "owned GPU pci address", values: "config: {devicePlugin: {ownedGPUs: {pciAddresses: [\"1b:00\"]}}}"},
	{name: "owned GPU uuid", values: "config: {devicePlugin: {ownedGPUs: {uuids: [\"0\"]}}}"},
	{name: "owned GPU uuid lower-case prefix", values: "config: {devicePlugin: {ownedGPUs: {uuids: [gpu-3ae1f2c4-0b6d-4e1a-9c2f-5d7e8f901234]}}}"},
	// vfPolicy
	{name: "VLAN 4095", values: "config: {vfPolicy: {allowedVLANs: [4095]}}"},
	{name: "VLAN 4095 as text", values: "config: {vfPolicy: {allowedVLANs: [\"4095\"]}}"},
	{name: "VLAN negative", values: "config: {vfPolicy: {allowedVLANs: [-1]}}"},
	{name: "VLAN with a plus", values: "config: {vfPolicy: {allowedVLANs: [\"+100\"]}}"},
	{name: "VLAN range above 4094", values: "config: {vfPolicy: {pfs: [{allowedVLANs: [\"100-5000\"]}]}}"},
	{name: "VLAN a bool", values: "config: {vfPolicy: {allowedVLANs: [true]}}"},
	{name: "VLAN a fraction", values: "config: {vfPolicy: {allowedVLANs: [100.5]}}"},
	{name: "VLAN range reversed", values: "config: {vfPolicy: {allowedVLANs: [\"300-200\"]}}",
		render: `config.vfPolicy: allowedVLANs "300-200": want a VLAN ID (0 to 4094) or a range from the lower to the higher`},
}

// goodConfigs: every config example the project ships, and values at
// the edges of what the agent takes.
func goodConfigs(t *testing.T) []configCase {
	out := []configCase{
		{name: "chart defaults", values: "{}"},
		{name: "pci address upper case, IDs with 0x", values: `config: {nics: [{select: {pciAddresses: ["0000:AB:00.0", "17:00.1"], vendorIDs: ["0x15B3"], deviceIDs: ["0X1021"]}}]}`},
		{name: "names of 15 bytes", values: `config: {nics: [{select: {names: [abcdefghijklmno, "éééééééx"]}}]}`},
		{name: "bandwidth as numbers", values: `config: {nics: [{bandwidth: {default: 25000000000, minimum: 5000000000, step: 5e9}}]}`},
		{name: "bandwidth at 100T", values: `config: {nics: [{bandwidth: {default: 100T, minimum: 100000000000000}}]}`},
		{name: "VLANs with leading zeros", values: `config: {vfPolicy: {allowedVLANs: [0, "0100", "00200-0299", "4094"]}}`},
		{name: "mps sizes as numbers", values: `config: {gpus: {mps: {shmSize: 1048576, daemonMemoryLimit: 67108864}}}`},
		{name: "mps sizes at the bounds", values: `config: {gpus: {mps: {shmSize: 1Ti, daemonMemoryLimit: 1Pi}}}`},
		{name: "resource prefixes", values: `config: {devicePlugin: {resources: ["example.com/*", "nvidia.com/mig-*", "a.b/` + strings.Repeat("g", 62) + `*", "x.y/A_b.c"]}}`},
		{name: "owned GPUs upper case", values: `config: {devicePlugin: {ownedGPUs: {pciAddresses: ["0000:1B:00.0"], uuids: [GPU-3AE1F2C4-0B6D-4E1A-9C2F-5D7E8F901234]}}}`},
		{name: "disabled without bandwidth", values: `config: {nics: [{mode: disabled}, {mode: exclusive}, {}]}`},
	}
	// The agent's own example, as the chart's config.
	example, err := os.ReadFile("../../api/config/v1alpha1/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, configCase{name: "example.yaml", values: "config:\n" + indent(dropTypeMeta(string(example)))})
	// The chart's values and its test clusters'.
	files, _ := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	for _, f := range append([]string{filepath.Join(chartDir, "values.yaml")}, files...) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, configCase{name: f, values: string(data)})
	}
	return append(out, docConfigs(t)...)
}

// docConfigs are the operator guide's YAML blocks that are AgentConfigs
// (every top-level key a field of it).
func docConfigs(t *testing.T) []configCase {
	data, err := os.ReadFile("../../docs/operator-guide.md")
	if err != nil {
		t.Fatal(err)
	}
	// The AgentConfig's fields, as the chart's schema names them under
	// config (deploy's TestValuesSchemaConfigIsAgentConfig holds them equal).
	var schema struct {
		Properties struct {
			Config struct {
				Properties map[string]any `json:"properties"`
			} `json:"config"`
		} `json:"properties"`
	}
	if err := yaml.Unmarshal([]byte(mustRead(t, filepath.Join(chartDir, "values.schema.json"))), &schema); err != nil {
		t.Fatal(err)
	}
	var fields []string
	for name := range schema.Properties.Config.Properties {
		fields = append(fields, name)
	}
	var out []configCase
	for i, block := range regexp.MustCompile("(?s)\n```yaml\n(.*?)\n```").FindAllStringSubmatch(string(data), -1) {
		var doc map[string]any
		if yaml.Unmarshal([]byte(block[1]), &doc) != nil || len(doc) == 0 {
			continue
		}
		if slices.ContainsFunc(mapKeys(doc), func(k string) bool { return !slices.Contains(fields, k) }) {
			continue
		}
		out = append(out, configCase{name: fmt.Sprintf("operator-guide.md yaml block %d", i), values: "config:\n" + indent(block[1])})
	}
	if len(out) < 6 {
		t.Fatalf("found %d AgentConfig examples in docs/operator-guide.md, want its 6 or more", len(out))
	}
	return out
}

// TestChartRefusesWhatTheAgentRefuses: a config the chart takes and the
// agent refuses would crash-loop every agent pod. The chart's schema takes
// every shipped config example and refuses each bad config the agent
// refuses; where it cannot (the rule spans fields, or is arithmetic on a
// quantity), a template refuses it at render, or the case says why
// nothing can. Every case is rendered as helm renders it (Render), and the
// agent parses the config.yaml of those rendered.
func TestChartRefusesWhatTheAgentRefuses(t *testing.T) {
	ch, err := load()
	if err != nil {
		t.Fatal(err)
	}
	check := func(c configCase, good bool) {
		file := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(file, []byte(c.values), 0o600); err != nil {
			t.Fatal(err)
		}
		// The agent's verdict on the config as the chart's values hold
		// it (its defaults under the file's values).
		vals, err := readValues([]string{file})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		coalesced, err := util.CoalesceValues(ch, vals)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		agentErr := parseAsRendered(coalesced["config"])
		out, renderErr := Render([]string{file})
		var schemaErr error
		if renderErr != nil && strings.Contains(renderErr.Error(), "values don't meet the specifications of the schema") {
			schemaErr = renderErr
		}
		if good {
			if renderErr != nil || agentErr != nil {
				t.Errorf("%s: a good config: chart: %v; agent: %v", c.name, renderErr, agentErr)
			}
		} else {
			checkBad(t, c, schemaErr, agentErr)
		}
		if schemaErr == nil {
			checkRendered(t, c, good, out, renderErr)
		}
	}
	for _, c := range goodConfigs(t) {
		check(c, true)
	}
	for _, c := range badConfigs {
		check(c, false)
	}
}

func checkBad(t *testing.T, c configCase, schemaErr, agentErr error) {
	t.Helper()
	switch {
	case agentErr == nil:
		t.Errorf("%s: the agent takes it: not a bad config", c.name)
	case c.render == "" && c.gap == "" && schemaErr == nil:
		t.Errorf("%s: the agent refuses it (%v), values.schema.json takes it", c.name, agentErr)
	case (c.render != "" || c.gap != "") && schemaErr != nil:
		t.Errorf("%s: values.schema.json refuses it now (%v): drop the case's render or gap", c.name, schemaErr)
	case c.gap != "":
		t.Logf("%s: refused by the agent only (%v): %s", c.name, agentErr, c.gap)
	}
}

// checkRendered checks a case the schema takes as the templates rendered
// it: a bad case must be refused (a gap's taken, as it says), a good one
// rendered to a config.yaml the agent takes.
func checkRendered(t *testing.T, c configCase, good bool, out map[string]string, err error) {
	t.Helper()
	switch {
	case err != nil && (good || c.gap != ""):
		t.Errorf("%s: the chart refuses it: %v", c.name, err)
	case err != nil && c.render != "" && !strings.Contains(err.Error(), c.render):
		t.Errorf("%s: the chart refuses it with %q, want %q", c.name, err, c.render)
	case err != nil:
	case !good && c.gap == "":
		t.Errorf("%s: the chart renders it", c.name)
	default:
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal([]byte(out["hwdra/templates/configmap.yaml"]), &cm); err != nil {
			t.Fatalf("%s: the rendered ConfigMap: %v", c.name, err)
		}
		if _, err := config.Parse([]byte(cm.Data["config.yaml"])); (err == nil) != good {
			t.Errorf("%s: the agent parses the rendered config.yaml with error %v", c.name, err)
		}
	}
}

// parseAsRendered is the agent's verdict on the chart's config as
// templates/configmap.yaml writes it (toYaml, sigs.k8s.io/yaml).
func parseAsRendered(cfg any) error {
	doc := "apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\n"
	if m, ok := cfg.(map[string]any); !ok || len(m) > 0 {
		text, err := yaml.Marshal(cfg)
		if err != nil {
			return err
		}
		doc += string(text)
	}
	_, err := config.Parse([]byte(doc))
	return err
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// dropTypeMeta leaves apiVersion and kind out: the chart writes them.
func dropTypeMeta(doc string) string {
	var keep []string
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(l, "apiVersion:") && !strings.HasPrefix(l, "kind:") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ") + "\n"
}

func mapKeys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
