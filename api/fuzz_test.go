// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// The opaque configuration a claim carries is written by tenants, and the
// agent decodes it at every prepare: whatever the bytes, Decode returns
// an object or an error, never panics. The fuzz tests (hack/fuzz.sh runs
// each for a while; plain go test runs their seeds and testdata/fuzz)
// hold it to more than that:
//
//   - an object that decodes encodes to JSON that decodes to the same
//     object (nothing the decoder takes is lost or changed on the way);
//   - it is defaulted for good (Default again changes nothing) and valid;
//   - an error is said in the document's terms: no Go type or decoder
//     internals, and for a document of a known kind it names a field the
//     document has (or the document itself).

// seedDocuments are the configurations of the repository's examples, the
// AgentConfig example, and one of each field the types have.
func seedDocuments(tb testing.TB) [][]byte {
	tb.Helper()
	var out [][]byte
	for _, glob := range []string{"../deploy/examples/*.yaml", "../docs/examples/*.yaml", "config/v1alpha1/example.yaml"} {
		files, err := filepath.Glob(glob)
		if err != nil {
			tb.Fatal(err)
		}
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				tb.Fatal(err)
			}
			dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
			for {
				var doc any
				if err := dec.Decode(&doc); err == io.EOF {
					break
				} else if err != nil {
					tb.Fatalf("%s: %v", file, err)
				}
				out = append(out, hwdraConfigs(doc)...)
			}
		}
	}
	for _, doc := range []string{
		`{"apiVersion":"gpu.hwdra.io/v1alpha1","kind":"GpuConfig","mig":{"computeInstanceSlices":2}}`,
		`{"apiVersion":"gpu.hwdra.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}}`,
		`{"apiVersion":"gpu.hwdra.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mps":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"10Gi"}}}`,
		`{"apiVersion":"gpu.hwdra.io/v1alpha1","kind":"GpuConfig","share":{"isolation":"Dedicated"}}`,
		"apiVersion: sriov.hwdra.io/v1alpha1\nkind: VfConfig\ninterfaceName: net1\nmtu: 9000\nmac: 02:00:00:00:00:01\nvlan: 10\nvlanQoS: 3\n" +
			"trust: true\nspoofCheck: false\nnodeGUID: 00:11:22:33:44:55:66:77\nportGUID: 00:11:22:33:44:55:66:78\naddresses: [10.0.0.2/24]\nroutes: [{destination: 10.1.0.0/16, gateway: 10.0.0.1}]\n",
		`{"apiVersion":"config.hwdra.io/v1alpha1","kind":"AgentConfig","nics":[{"mode":"exclusive"}]}`,
	} {
		out = append(out, []byte(doc))
	}
	return out
}

// hwdraConfigs finds the hwdra API objects in a decoded manifest: claims'
// and classes' opaque parameters, ConfigMap documents aside. Each comes as
// JSON and as YAML.
func hwdraConfigs(v any) [][]byte {
	var out [][]byte
	switch v := v.(type) {
	case map[string]any:
		if s, _ := v["apiVersion"].(string); strings.Contains(s, ".hwdra.io/") {
			js, _ := json.Marshal(v)
			y, _ := yaml.Marshal(v)
			return [][]byte{js, y}
		}
		for _, x := range v {
			out = append(out, hwdraConfigs(x)...)
		}
	case []any:
		for _, x := range v {
			out = append(out, hwdraConfigs(x)...)
		}
	}
	return out
}

func FuzzDecode(f *testing.F) {
	for _, s := range seedDocuments(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		obj, err := Decode(data)
		if err != nil {
			checkDecodeError(t, data, err)
			return
		}
		js, err := json.Marshal(obj)
		if err != nil {
			t.Fatalf("%T does not encode: %v", obj, err)
		}
		again, err := Decode(js)
		if err != nil {
			t.Fatalf("a decoded %T encodes to what does not decode: %v\n%s", obj, err, js)
		}
		if !equality.Semantic.DeepEqual(obj, again) {
			t.Fatalf("decode, encode, decode changed the object:\n%#v\n%#v\n%s", obj, again, js)
		}
		defaulted := obj.DeepCopyObject().(Object)
		defaulted.Default()
		if !equality.Semantic.DeepEqual(obj, defaulted) {
			t.Fatalf("Default again changed %#v to %#v", obj, defaulted)
		}
		if errs := obj.Validate(); len(errs) > 0 {
			t.Fatalf("a decoded %T is not valid: %v", obj, errs)
		}
	})
}

// leaks are what an error in the document's terms never says.
var leaks = []string{"Go struct field", "Go value of type", "json: cannot unmarshal", "v1alpha1.", "reflect.", "interface {}", "%!"}

func checkDecodeError(t *testing.T, data []byte, err error) {
	t.Helper()
	msg := err.Error()
	if strings.TrimSpace(msg) == "" {
		t.Fatal("an empty error")
	}
	for _, l := range leaks {
		if strings.Contains(msg, l) && !bytes.Contains(data, []byte(l)) { // not the document's own words echoed
			t.Fatalf("the error %q says %q: not in the document's terms", msg, l)
		}
	}
	js, jerr := toJSON(data)
	if jerr != nil || checkKind(js) != nil {
		return // a syntax error (it gives the line) or no known kind (it names apiVersion or kind)
	}
	var doc map[string]any
	if json.Unmarshal(js, &doc) != nil {
		return
	}
	keys := map[string]bool{}
	collectKeys(doc, keys)
	delete(keys, "apiVersion")
	delete(keys, "kind")
	if strings.Contains(msg, "the document") {
		return
	}
	for k := range keys {
		quoted := strconv.Quote(k) // as %q writes it ("" for the empty key)
		if strings.Contains(msg, quoted) || k != "" && (strings.Contains(msg, k) || strings.Contains(msg, quoted[1:len(quoted)-1])) {
			return
		}
	}
	t.Fatalf("the error %q names no field of the document (%v)", msg, keys)
}

func collectKeys(v any, keys map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			keys[k] = true
			collectKeys(x, keys)
		}
	case []any:
		for _, x := range v {
			collectKeys(x, keys)
		}
	}
}
