// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	gpuv1alpha1 "github.com/hwdra/hwdra/api/gpu/v1alpha1"
	sriovv1alpha1 "github.com/hwdra/hwdra/api/sriov/v1alpha1"
)

func claimWith(configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			Devices: resourceapi.DeviceAllocationResult{Config: configs},
		}},
	}
}

func opaque(source resourceapi.AllocationConfigSource, driver, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{Source: source, Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)}},
	}}
}

const vf = `{"apiVersion":"sriov.hwdra.io/v1alpha1","kind":"VfConfig"`

func TestVfConfigErrorsNameRequestSourceAndField(t *testing.T) {
	t.Parallel()
	cases := map[string]struct{ params, want string }{
		"unknown field": {vf + `,"mtuu":1500}`, `unknown field "mtuu"`},
		"bad mtu":       {vf + `,"mtu":20}`, "mtu: Invalid value: 20"},
		"bad mac":       {vf + `,"mac":"zz"}`, "mac: Invalid value"},
		"multicast mac": {vf + `,"mac":"01:00:5e:00:00:01"}`, "must be a unicast address"},
		"bad vlan":      {vf + `,"vlan":4095}`, "vlan: Invalid value: 4095"},
		"qos sans vlan": {vf + `,"vlanQoS":3}`, "vlanQoS: Invalid value: 3: needs a vlan"},
		"bad address":   {vf + `,"addresses":["10.0.0.1"]}`, "addresses[0]: Invalid value"},
		"bad route":     {vf + `,"routes":[{"destination":"10.0.0.0/8","gateway":"fe80::1"}]}`, "routes[0].gateway"},
		"bad ifname":    {vf + `,"interfaceName":"a/b"}`, "interfaceName: Invalid value"},
		"wrong kind":    {`{"apiVersion":"gpu.hwdra.io/v1alpha1","kind":"GpuConfig"}`, "GpuConfig is not a configuration for sriov.hwdra.io"},
		"unknown kind":  {`{"apiVersion":"sriov.hwdra.io/v1alpha1","kind":"Nope"}`, `kind: Unsupported value: "Nope"`},
		"agent config":  {`{"apiVersion":"config.hwdra.io/v1alpha1","kind":"AgentConfig"}`, "AgentConfig is not a configuration for sriov.hwdra.io"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := claimWith(opaque(resourceapi.AllocationConfigSourceClaim, "sriov.hwdra.io", tc.params, "net"))
			_, err := ForRequest(c, "sriov.hwdra.io", "net", &sriovv1alpha1.VfConfig{})
			if err == nil {
				t.Fatal("no error")
			}
			for _, want := range []string{`request "net", config[0] from the claim`, tc.want} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

func TestClaimOverridesClassAndRequestsFilter(t *testing.T) {
	t.Parallel()
	c := claimWith(
		opaque(resourceapi.AllocationConfigSourceClass, "sriov.hwdra.io", vf+`,"mtu":9000}`),
		opaque(resourceapi.AllocationConfigSourceClaim, "sriov.hwdra.io", vf+`,"mtu":1500}`, "net"),
		opaque(resourceapi.AllocationConfigSourceClaim, "sriov.hwdra.io", vf+`,"mtu":4000}`, "other"),
		opaque(resourceapi.AllocationConfigSourceClaim, "gpu.hwdra.io", `{"apiVersion":"gpu.hwdra.io/v1alpha1","kind":"GpuConfig"}`),
	)
	got, err := ForRequest(c, "sriov.hwdra.io", "net", &sriovv1alpha1.VfConfig{})
	if err != nil || *got.MTU != 1500 || got.InterfaceName != "" || !*got.SpoofCheck {
		t.Fatalf("%+v %v", got, err)
	}
	got, _ = ForRequest(c, "sriov.hwdra.io", "third", &sriovv1alpha1.VfConfig{})
	if *got.MTU != 9000 {
		t.Fatalf("class config not applied to other requests: %+v", got)
	}
	sub, _ := ForRequest(c, "sriov.hwdra.io", "net/fast", &sriovv1alpha1.VfConfig{})
	if *sub.MTU != 1500 {
		t.Fatalf("subrequest did not get its parent's config: %+v", sub)
	}
	none, err := ForRequest(claimWith(), "sriov.hwdra.io", "net", &sriovv1alpha1.VfConfig{})
	if err != nil || none.InterfaceName != "" || none.MTU != nil {
		t.Fatalf("defaults: %+v %v", none, err)
	}
}

// TestForRequestFrom names the configuration that applies to a request,
// the one a later config overrode not: a share's isolation from its
// DeviceClass, replaced by the claim's own GpuConfig for its request.
func TestForRequestFrom(t *testing.T) {
	t.Parallel()
	const gpu = `{"apiVersion":"gpu.hwdra.io/v1alpha1","kind":"GpuConfig"`
	c := claimWith(
		opaque(resourceapi.AllocationConfigSourceClass, "gpu.hwdra.io", gpu+`,"share":{"isolation":"Dedicated"}}`, "a", "b"),
		opaque(resourceapi.AllocationConfigSourceClaim, "gpu.hwdra.io", gpu+`,"share":{}}`, "b"),
	)
	for request, want := range map[string]struct {
		from      string
		isolation gpuv1alpha1.ShareIsolation
	}{
		"a": {"config[0] from the DeviceClass", gpuv1alpha1.Dedicated},
		"b": {"config[1] from the claim", gpuv1alpha1.Policed},
	} {
		got, from, err := ForRequestFrom(c, "gpu.hwdra.io", request, &gpuv1alpha1.GpuConfig{})
		if err != nil || from != want.from || got.Share == nil || got.Share.Isolation != want.isolation {
			t.Errorf("request %s: %+v from %q, %v; want isolation %s from %q", request, got.Share, from, err, want.isolation, want.from)
		}
	}
	if got, from, err := ForRequestFrom(c, "gpu.hwdra.io", "other", &gpuv1alpha1.GpuConfig{}); err != nil || from != "" || got.Share != nil {
		t.Errorf("a request no config names: %+v from %q, %v", got, from, err)
	}
}

func TestGpuConfig(t *testing.T) {
	t.Parallel()
	c := claimWith(opaque(resourceapi.AllocationConfigSourceClaim, "gpu.hwdra.io",
		`{"apiVersion":"gpu.hwdra.io/v1alpha1","kind":"GpuConfig","mig":{"computeInstanceSlices":9}}`))
	if _, err := ForRequest(c, "gpu.hwdra.io", "gpu", &gpuv1alpha1.GpuConfig{}); err == nil || !strings.Contains(err.Error(), "mig.computeInstanceSlices") {
		t.Fatalf("want mig.computeInstanceSlices error, got %v", err)
	}
}

// TestUnappliedConfigs: a configuration whose driver owns none of the
// devices it applies to is named by where the user wrote it; one whose
// driver owns some of them, or that applies to a request of its driver,
// is not.
func TestUnappliedConfigs(t *testing.T) {
	t.Parallel()
	gpu := `{"apiVersion":"gpu.hwdra.io/v1alpha1","kind":"GpuConfig"}`
	c := claimWith(
		opaque(resourceapi.AllocationConfigSourceClass, "gpu.hwdra.io", gpu),
		opaque(resourceapi.AllocationConfigSourceClaim, "gpu.nvidia.com", `{}`, "gpu"),
		opaque(resourceapi.AllocationConfigSourceClaim, "sriov.hwdra.io", vf+`}`, "net"),
		opaque(resourceapi.AllocationConfigSourceClaim, "sriov.hwdra.io", vf+`}`, "gpu"),
		opaque(resourceapi.AllocationConfigSourceClaim, "gpu.hwdra.io", gpu),
	)
	c.Status.Allocation.Devices.Results = []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpu/small", Driver: "gpu.hwdra.io", Pool: "n", Device: "g"},
		{Request: "net", Driver: "sriov.hwdra.io", Pool: "n", Device: "v"},
	}
	var got []string
	for _, u := range UnappliedConfigs(c) {
		got = append(got, u.String())
	}
	want := []string{
		"spec.devices.config[0] is for driver gpu.nvidia.com, which owns none of the devices it applies to (gpu.hwdra.io): no driver reads it (written for NVIDIA's GPU DRA driver: `hwdra convert` rewrites such manifests for hwdra)",
		"spec.devices.config[2] is for driver sriov.hwdra.io, which owns none of the devices it applies to (gpu.hwdra.io): no driver reads it",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestLayers: each configuration that applies to a request, in order, as
// written (a field it leaves out stays unset: the caller tells the class's
// settings from the claim's), with its source.
func TestLayers(t *testing.T) {
	t.Parallel()
	c := claimWith(
		opaque(resourceapi.AllocationConfigSourceClass, "sriov.hwdra.io", vf+`,"vlan":100,"trust":true}`),
		opaque(resourceapi.AllocationConfigSourceClaim, "sriov.hwdra.io", vf+`,"mtu":1500}`, "net"),
		opaque(resourceapi.AllocationConfigSourceClaim, "sriov.hwdra.io", vf+`,"mtu":4000}`, "other"),
	)
	layers, err := Layers(c, "sriov.hwdra.io", "net", &sriovv1alpha1.VfConfig{})
	if err != nil || len(layers) != 2 {
		t.Fatalf("%+v %v", layers, err)
	}
	class, claim := layers[0], layers[1]
	if !class.Class || class.From != "config[0] from the DeviceClass" || *class.Config.VLAN != 100 || !*class.Config.Trust || class.Config.SpoofCheck != nil {
		t.Errorf("the class's layer: %+v %+v", class, class.Config)
	}
	if claim.Class || claim.From != "config[1] from the claim" || *claim.Config.MTU != 1500 || claim.Config.Trust != nil || claim.Config.SpoofCheck != nil {
		t.Errorf("the claim's layer, as written: %+v %+v", claim, claim.Config)
	}
	// Validation still sees the document as defaulted.
	bad := claimWith(opaque(resourceapi.AllocationConfigSourceClaim, "sriov.hwdra.io", vf+`,"vlanQoS":3}`))
	if _, err := Layers(bad, "sriov.hwdra.io", "net", &sriovv1alpha1.VfConfig{}); err == nil || !strings.Contains(err.Error(), "vlanQoS: Invalid value: 3: needs a vlan") {
		t.Errorf("got %v", err)
	}
}
