// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package claimspec

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	"sigs.k8s.io/yaml"
)

// FuzzFromV1beta: a claim spec of either beta version, whatever it
// holds, converts without a panic, and nothing is lost or moved:
// v1beta2's converts to v1 field for field (the same JSON), v1beta1's
// keeps its requests, in order, each request's own fields under
// exactly.
func FuzzFromV1beta(f *testing.F) {
	files, err := filepath.Glob("../../../deploy/examples/*.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		for _, doc := range bytes.Split(data, []byte("\n---")) {
			var obj struct {
				Spec struct {
					Spec json.RawMessage `json:"spec"`
				} `json:"spec"`
			}
			if yaml.Unmarshal(doc, &obj) == nil && obj.Spec.Spec != nil {
				f.Add([]byte(obj.Spec.Spec))
			}
		}
	}
	f.Add([]byte(`{"devices":{"requests":[{"name":"gpu","deviceClassName":"gpu.hwdra.io","count":2,"allocationMode":"ExactCount","selectors":[{"cel":{"expression":"true"}}]}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var b2 resourcev1beta2.ResourceClaimSpec
		if json.Unmarshal(data, &b2) == nil {
			v1, err := FromV1beta2(b2)
			if err == nil {
				in, _ := json.Marshal(b2)
				out, _ := json.Marshal(v1)
				if !bytes.Equal(in, out) {
					t.Fatalf("v1beta2 %s converted to v1 %s", in, out)
				}
			}
		}
		var b1 resourcev1beta1.ResourceClaimSpec
		if json.Unmarshal(data, &b1) != nil {
			return
		}
		v1, err := FromV1beta1(b1)
		if err != nil {
			return
		}
		if len(v1.Devices.Requests) != len(b1.Devices.Requests) {
			t.Fatalf("%d requests became %d", len(b1.Devices.Requests), len(v1.Devices.Requests))
		}
		for i, r := range b1.Devices.Requests {
			got := v1.Devices.Requests[i]
			if got.Name != r.Name || len(got.FirstAvailable) != len(r.FirstAvailable) {
				t.Fatalf("request %d %q became %q with %d subrequests (had %d)", i, r.Name, got.Name, len(got.FirstAvailable), len(r.FirstAvailable))
			}
			if r.DeviceClassName != "" && (got.Exactly == nil || got.Exactly.DeviceClassName != r.DeviceClassName || got.Exactly.Count != r.Count ||
				len(got.Exactly.Selectors) != len(r.Selectors)) {
				t.Fatalf("request %d: %+v became %+v", i, r, got.Exactly)
			}
		}
	})
}
