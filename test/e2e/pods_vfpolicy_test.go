// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// vfPolicyConfig is the chart's config of the VfPolicy scenario: claims
// may put their VF on VLAN 100 on any PF, and on VLAN 200 too on Intel
// PFs (vendor 8086: none on mock:cx7, whose two PFs are ConnectX-7);
// trust, spoof checking off, MAC addresses and GUIDs on none.
var vfPolicyConfig = map[string]any{"vfPolicy": map[string]any{
	"allowedVLANs": []any{100},
	"pfs":          []any{map[string]any{"select": map[string]any{"vendorIDs": []any{"8086"}}, "allowedVLANs": []any{100, 200}}},
}}

// vfConfigClaim is a 10 Gb/s VF share whose request "nic" carries a
// VfConfig (JSON fields after the kind).
func vfConfigClaim(t *testing.T, name, fields string) *resourceapi.ResourceClaim {
	t.Helper()
	c := shareClaim(t, "10G")
	c.Name = name
	raw := `{"apiVersion": "sriov.hwdra.io/v1alpha1", "kind": "VfConfig"` + fields + `}`
	c.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: []string{"nic"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: nicDriver, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}}}
	return c
}

// TestVfPolicyPods: the agents' VF policy (the chart's config.vfPolicy),
// where the user sees it. A claim (or template) that sets trust, or a VLAN
// no PF allows, is refused when it is created by the chart's vf-policy
// admission policy, naming the field and the setting. A pod whose claim
// asks for VLAN 100 runs with its VF as net1 in the container, the
// metadata saying VLAN 100. A pod whose claim asks for VLAN 200 (allowed
// on Intel PFs, so past admission, but not on this node's ConnectX-7
// PFs) is scheduled and never starts: the kubelet's event on it carries
// the agent's refusal, naming the claim, the field, the PF and the
// setting, and no VF was touched for it.
func TestVfPolicyPods(t *testing.T) {
	s := startScenarioWith(t, "vf-policy", "mock:cx7", vfPolicyConfig, nicDriver)
	before := nodeLinks(t)

	// At creation: what no PF allows.
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	for _, tc := range []struct{ name, fields, want string }{
		{"trust", `, "trust": true`, "trust: true (no PF lets claims set it; allowTrust)"},
		{"VLAN 300", `, "vlan": 300`, "vlan 300 (no PF lets claims use it; allowedVLANs: 100, 200)"},
		{"a router's MAC", `, "mac": "02:00:5e:00:01:01"`, "mac 02:00:5e:00:01:01 (no PF lets claims choose it; allowMAC)"},
	} {
		c := vfConfigClaim(t, "refused", tc.fields)
		c.Namespace = s.ns
		var err error
		// The policy takes effect once the API server has loaded it.
		if werr := wait.PollUntilContextTimeout(s.ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err = s.n.Admin.ResourceV1().ResourceClaims(s.ns).Create(ctx, c, dry)
			return err != nil, nil
		}); werr != nil {
			t.Fatalf("%s: a claim with%s was admitted", tc.name, tc.fields)
		}
		checkVFRefusal(t, tc.name+" claim", err, tc.want)
		_, err = s.n.Admin.ResourceV1().ResourceClaimTemplates(s.ns).Create(s.ctx, framework.TemplateFor(c), dry)
		checkVFRefusal(t, tc.name+" template", err, tc.want)
		t.Logf("%s: refused at creation: %v", tc.name, err)
	}

	// Within the policy: the pod gets its VF, on VLAN 100.
	r := s.runPod("vlan-100", s.template(vfConfigClaim(t, "vlan-100", `, "vlan": 100`)), "vf-policy vlan 100", "/dev",
		framework.MetadataPath("devices", "nic", nicDriver))
	res := result(t, r.claim, "nic")
	checkInterface(t, s.n, s.ctx, r.pod.Name, r.out, r.claim, res, framework.MetadataPath("devices", "nic", nicDriver), defaultVF)
	if vlan, ok := attrValue(metadataDevice(t, r, res), nicDriver, nicDriver+"/vlan").(float64); !ok || vlan != 100 {
		t.Errorf("pod vlan-100: metadata vlan %v, want 100", attrValue(metadataDevice(t, r, res), nicDriver, nicDriver+"/vlan"))
	}

	// Past admission, refused at prepare: VLAN 200 is not this node's.
	tmpl := s.template(vfConfigClaim(t, "vlan-200", `, "vlan": 200`))
	s.createPod("vlan-200", tmpl)
	event := s.waitEvent("vlan-200", "vfPolicy.allowedVLANs", 60*time.Second)
	t.Logf("pod vlan-200: %s", event)
	for _, want := range []string{"claim " + s.ns + "/", `request "nic"`, "vlan: 200 (config[0] from the claim) is not allowed on PF ",
		"vfPolicy.allowedVLANs does not list it (it lists 100)"} {
		if !strings.Contains(event, want) {
			t.Errorf("the prepare refusal %q does not say %q", event, want)
		}
	}
	s.checkNotStarted("vlan-200", "vfPolicy.allowedVLANs")

	s.deletePod("vlan-100")
	s.deletePod("vlan-200")
	waitNodeLinks(t, before)
}

func checkVFRefusal(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "config.vfPolicy") ||
		!strings.Contains(err.Error(), "the VfConfig of request nic") {
		t.Errorf("%s: %v, want refused saying %q, naming the request and config.vfPolicy", what, err, want)
	}
}
