// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"regexp"
	"strings"
	"testing"

	configv1alpha1 "github.com/hwdra/hwdra/api/config/v1alpha1"
	sriovv1alpha1 "github.com/hwdra/hwdra/api/sriov/v1alpha1"
)

// goTerms are what an error must never show a user: Go types, the
// decoder's internals.
var goTerms = regexp.MustCompile(`Go (struct|value)|struct \{|json:|v1alpha1\.|\.go:|of type|unmarshal (number|string|array|object|bool)`)

// TestDecodeErrorsInTheDocumentsTerms: every kind of bad document gets an
// error that names the field and what is wrong, in YAML and JSON alike.
func TestDecodeErrorsInTheDocumentsTerms(t *testing.T) {
	t.Parallel()
	const vf = "apiVersion: sriov.hwdra.io/v1alpha1\nkind: VfConfig\n"
	const agent = "apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\n"
	for _, tc := range []struct{ name, doc, want string }{
		// The document and its kind.
		{"empty", "", "empty document"},
		{"only a comment", "# nothing\n", "empty document"},
		{"a list", "[]", "must be an object with apiVersion and kind"},
		{"a string", `"x"`, "must be an object with apiVersion and kind"},
		{"no apiVersion", "kind: VfConfig\n", "apiVersion: Required value"},
		{"no kind", "apiVersion: sriov.hwdra.io/v1alpha1\n", "kind: Required value"},
		{"apiVersion a number", `{"apiVersion": 1, "kind": "VfConfig"}`, "apiVersion: Invalid value: 1: must be a string"},
		{"apiVersion malformed", "apiVersion: a/b/c\nkind: VfConfig\n", `apiVersion: Invalid value: "a/b/c": must be group/version`},
		{"unknown group", "apiVersion: example.com/v1\nkind: VfConfig\n",
			`apiVersion: Unsupported value: "example.com/v1": supported values: "config.hwdra.io/v1alpha1", "gpu.hwdra.io/v1alpha1", "sriov.hwdra.io/v1alpha1"`},
		{"unknown version", "apiVersion: config.hwdra.io/v2\nkind: AgentConfig\n",
			`apiVersion: Unsupported value: "config.hwdra.io/v2": supported values: "config.hwdra.io/v1alpha1"`},
		{"unknown kind", "apiVersion: sriov.hwdra.io/v1alpha1\nkind: Nope\n", `kind: Unsupported value: "Nope": supported values: "VfConfig"`},
		// Syntax and duplicates, with the line.
		{"bad YAML", vf + "mtu: [\n", "yaml: line 3: did not find expected node content"},
		{"duplicate key", vf + "mtu: 1500\nmtu: 9000\n", `line 4: key "mtu" already set in map`},
		{"duplicate key in JSON", `{"apiVersion": "sriov.hwdra.io/v1alpha1", "kind": "VfConfig", "mtu": 1, "mtu": 2}`, `key "mtu" already set in map`},
		// Unknown fields, every one with its path.
		{"unknown fields", vf + "routes:\n- {destination: 10.0.0.0/8, x: 1}\n- {destination: 10.1.0.0/16, Gateway: 10.1.0.1}\nmtuu: 1\n",
			`[unknown field "mtuu", unknown field "routes[0].x", unknown field "routes[1].Gateway"]`},
		{"unknown nested field", agent + "nics:\n- {}\n- bandwidth: {stp: 1G}\n", `unknown field "nics[1].bandwidth.stp"`},
		// Wrong types, found again in the document with their indices.
		{"string for an integer", vf + "mtu: x\n", `mtu: Invalid value: "x": must be an integer`},
		{"fraction for an integer", vf + "mtu: 1.5\n", "mtu: Invalid value: 1.5: must be an integer"},
		{"number for a string", vf + "routes:\n- destination: 10.0.0.0/8\n- destination: 1\n", "routes[1].destination: Invalid value: 1: must be a string (quote it)"},
		{"list for a string", vf + "routes:\n- destination: [1]\n", "routes[0].destination: Invalid value: must be a string, not a list"},
		{"object for a list", agent + "nics: {mode: shared}\n", "nics: Invalid value: must be a list, not an object"},
		{"string for an object", agent + "nics:\n- select: eth0\n", `nics[0].select: Invalid value: "eth0": must be an object`},
		{"string for a bool", vf + "trust: \"yes\"\n", `trust: Invalid value: "yes": must be true or false`},
		{"unquoted hex ID", agent + "nics:\n- {}\n- select: {deviceIDs: [\"101b\", 1021]}\n", "nics[1].select.deviceIDs[1]: Invalid value: 1021: must be a string (quote it)"},
		{"number for an optional object", "apiVersion: gpu.hwdra.io/v1alpha1\nkind: GpuConfig\nmig: 5\n", "mig: Invalid value: 5: must be an object"},
		{"negative XID", agent + "health:\n  xids: {ignore: [63, -1]}\n", "health.xids.ignore[1]: Invalid value: -1: must be a non-negative integer"},
		// A value its own type refuses (found by FuzzDecode: the quantity's
		// error named no field).
		{"bad quantity", "apiVersion: gpu.hwdra.io/v1alpha1\nkind: GpuConfig\nsharing: {strategy: MPS, mps: {defaultPinnedDeviceMemoryLimit: 10 GB}}\n",
			`sharing.mps.defaultPinnedDeviceMemoryLimit: Invalid value: "10 GB": quantities must match the regular expression`},
		{"list key", "apiVersion: gpu.hwdra.io/v1alpha1\nkind: GpuConfig\n? [a]\n: 1\n", "a key is null, a list or an object: keys must be strings"},
		{"null key", "apiVersion: gpu.hwdra.io/v1alpha1\nkind: GpuConfig\n~: 1\n", "a key is null, a list or an object: keys must be strings"},
		// Bad values: validation, every problem at once.
		{"bad values", vf + "mtu: 20\nvlan: 5000\n", "[mtu: Invalid value: 20: must be between 68 and 9216, vlan: Invalid value: 5000: must be between 0 and 4094]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj, err := Decode([]byte(tc.doc))
			if err == nil {
				t.Fatalf("decoded %+v", obj)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\n  lacks %q", err, tc.want)
			}
			if goTerms.MatchString(err.Error()) {
				t.Errorf("error %q speaks of Go, not of the document", err)
			}
		})
	}
}

func TestDecodeDefaultsAndValidates(t *testing.T) {
	t.Parallel()
	obj, err := Decode([]byte("apiVersion: sriov.hwdra.io/v1alpha1\nkind: VfConfig\nmtu: 9000\n"))
	if err != nil {
		t.Fatal(err)
	}
	vf, ok := obj.(*sriovv1alpha1.VfConfig)
	if !ok || *vf.MTU != 9000 || vf.SpoofCheck == nil || !*vf.SpoofCheck {
		t.Fatalf("%#v", obj)
	}
	// JSON, as the API server hands opaque parameters over.
	obj, err = Decode([]byte(`{"apiVersion":"config.hwdra.io/v1alpha1","kind":"AgentConfig","nics":[{"mode":"exclusive"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if ac, ok := obj.(*configv1alpha1.AgentConfig); !ok || ac.NICs[0].Mode != configv1alpha1.ModeExclusive {
		t.Fatalf("%#v", obj)
	}
}

// TestUnmarshal: documents without a kind (mock hardware profiles) get
// the same strictness and messages.
func TestUnmarshal(t *testing.T) {
	t.Parallel()
	type item struct {
		Name string `json:"name"`
	}
	type doc struct {
		Count int    `json:"count"`
		Items []item `json:"items"`
	}
	var d doc
	if err := Unmarshal([]byte("count: 2\nitems: [{name: a}]\n"), &d); err != nil || d.Count != 2 || d.Items[0].Name != "a" {
		t.Fatalf("%+v %v", d, err)
	}
	for _, tc := range []struct{ doc, want string }{
		{"", "empty document"},
		{"[]", "the document must be an object"},
		{"count: many\n", `count: Invalid value: "many": must be an integer`},
		{"items: [{name: a}, {name: 7}]\n", "items[1].name: Invalid value: 7: must be a string (quote it)"},
		{"items: [{nme: a}]\ncnt: 1\n", `[unknown field "cnt", unknown field "items[0].nme"]`},
		{"count: 1\ncount: 2\n", `line 2: key "count" already set in map`},
	} {
		err := Unmarshal([]byte(tc.doc), &doc{})
		if err == nil || !strings.Contains(err.Error(), tc.want) || goTerms.MatchString(err.Error()) {
			t.Errorf("%q: error %v, want %q", tc.doc, err, tc.want)
		}
	}
}
