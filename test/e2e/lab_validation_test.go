// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestLabValidatesAsTheAPIServer: `hwdra lab` says it validates claims as
// the API server would. Each document here goes to the real API server
// (a dry-run create, strict field validation) and to the lab: the lab
// refuses exactly what the API server refuses, naming every field the API
// server names, and takes what it takes.
func TestLabValidatesAsTheAPIServer(t *testing.T) {
	n := framework.Shared(t)
	bin := framework.HwdraBinary(t)
	ns := n.CreateNamespace(t, "labvalid")
	const head = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n"
	request := func(r string) string {
		return "spec:\n  devices:\n    requests:\n    - name: gpu\n      " + r + "\n"
	}
	gpu := request("exactly: {deviceClassName: gpu.hwdra.io}")
	for _, tc := range []struct{ name, doc string }{
		{"valid", head + "metadata: {name: ok}\n" + gpu},
		{"generateName only", head + "metadata: {generateName: gen-}\n" + gpu},
		{"no name", head + "metadata: {}\n" + gpu},
		{"name not a DNS subdomain", head + "metadata: {name: Bad_Name}\n" + gpu},
		{"name too long", head + "metadata: {name: " + strings.Repeat("a", 254) + "}\n" + gpu},
		{"label key", head + "metadata: {name: lbl, labels: {\"a b\": c}}\n" + gpu},
		{"label value", head + "metadata: {name: lblv, labels: {a: \"b c\"}}\n" + gpu},
		{"annotation key", head + "metadata: {name: ann, annotations: {\"/x\": v}}\n" + gpu},
		{"namespace not a DNS label", head + "metadata: {name: nsx, namespace: Bad_NS}\n" + gpu},
		{"count -1", head + "metadata: {name: neg}\n" + request("exactly: {deviceClassName: gpu.hwdra.io, count: -1}")},
		{"count 0 is defaulted", head + "metadata: {name: zero}\n" + request("exactly: {deviceClassName: gpu.hwdra.io, count: 0}")},
		{"negative capacity", head + "metadata: {name: negcap}\n" +
			request("exactly: {deviceClassName: vf-share.sriov.hwdra.io, capacity: {requests: {sriov.hwdra.io/bandwidth: -10G}}}")},
		{"unqualified capacity name", head + "metadata: {name: capname}\n" +
			request("exactly: {deviceClassName: vf-share.sriov.hwdra.io, capacity: {requests: {bandwidth: 10G}}}")},
		{"bad selector", head + "metadata: {name: cel}\n" + request("exactly: {deviceClassName: gpu.hwdra.io, selectors: [{cel: {expression: 'device.attributes['}}]}")},
		{"bad class name", head + "metadata: {name: cls}\n" + request("exactly: {deviceClassName: Bad_Class}")},
		{"bad toleration", head + "metadata: {name: tol}\n" + request("exactly: {deviceClassName: gpu.hwdra.io, tolerations: [{key: \"a b\", operator: Exists}]}")},
		{"unknown field", head + "metadata: {name: typo}\nspec: {devices: {requets: []}}\n"},
		{"template with bad claim labels", "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: tmpl}\nspec:\n  metadata: {labels: {\"a b\": c}}\n  spec:\n    devices:\n      requests:\n      - name: gpu\n        exactly: {deviceClassName: gpu.hwdra.io}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			apiErr := apiServerCreate(t, n, ns, tc.doc)
			labErr := labValidate(t, bin, tc.doc)
			t.Logf("API server: %v\nlab: %s", apiErr, labErr)
			switch {
			case apiErr == nil && labErr != "":
				t.Errorf("the API server takes it, the lab refuses it: %s", labErr)
			case apiErr != nil && labErr == "":
				t.Errorf("the API server refuses it (%v), the lab takes it", apiErr)
			case apiErr != nil:
				for _, field := range causeFields(apiErr) {
					if !strings.Contains(labErr, field) {
						t.Errorf("the API server names %s, the lab does not: %s", field, labErr)
					}
				}
			}
		})
	}
}

// apiServerCreate creates doc (with the namespace it names, else ns) with
// a dry run and strict field validation, as `kubectl create -f` does.
func apiServerCreate(t *testing.T, n *framework.Node, ns, doc string) error {
	t.Helper()
	js, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	var head struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(js, &head); err != nil {
		t.Fatal(err)
	}
	if head.Metadata.Namespace != "" {
		ns = head.Metadata.Namespace
	}
	resource := map[string]string{"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}[head.Kind]
	return n.Admin.ResourceV1().RESTClient().Post().Namespace(ns).Resource(resource).
		Param("dryRun", "All").Param("fieldValidation", "Strict").
		Body(js).Do(context.Background()).Error()
}

// labValidate runs `hwdra lab` on doc (from stdin) and returns its error
// output when it refuses the claim as invalid, before it opens the
// hardware; "" when it takes it (whether the claim then fits the mock
// node is another matter).
func labValidate(t *testing.T, bin, doc string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "lab", "--hardware", "mock:dgx-h100", "--claim", "-")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(doc), &stdout, &stderr
	if err := cmd.Run(); err == nil || strings.Contains(stdout.String(), "== Hardware and slices ==") {
		return ""
	}
	return stderr.String()
}

// causeFields are the fields an API error names.
func causeFields(err error) []string {
	var fields []string
	if s, ok := err.(apierrors.APIStatus); ok && s.Status().Details != nil {
		for _, c := range s.Status().Details.Causes {
			if c.Field != "" {
				fields = append(fields, c.Field)
			}
		}
	}
	return fields
}
