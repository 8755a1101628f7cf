// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package convert

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/api"
	gpuv1alpha1 "github.com/hwdra/hwdra/api/gpu/v1alpha1"
	"github.com/hwdra/hwdra/internal/tools/lab"
)

// The testdata are NVIDIA-shaped manifests written for these tests
// after the shapes of NVIDIA's demo specs and API types.
func convertFiles(t *testing.T, names ...string) Result {
	t.Helper()
	var paths []string
	for _, n := range names {
		paths = append(paths, filepath.Join("testdata", n))
	}
	in, err := Read(paths, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Convert(in)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// docs splits the output and decodes each document strictly into its
// API type.
func docs(t *testing.T, out []byte) map[string]any {
	t.Helper()
	objs := map[string]any{}
	for _, d := range strings.Split(string(out), "\n---\n") {
		var head struct {
			Kind     string
			Metadata struct{ Name string }
		}
		if err := yaml.Unmarshal([]byte(d), &head); err != nil {
			t.Fatalf("%v:\n%s", err, d)
		}
		var obj any
		switch head.Kind {
		case "ResourceClaim":
			obj = &resourceapi.ResourceClaim{}
		case "ResourceClaimTemplate":
			obj = &resourceapi.ResourceClaimTemplate{}
		case "DeviceClass":
			obj = &resourceapi.DeviceClass{}
		case "Pod":
			obj = &corev1.Pod{}
		case "Namespace":
			obj = &corev1.Namespace{}
		default:
			t.Fatalf("unexpected kind %q in the output:\n%s", head.Kind, d)
		}
		if err := yaml.UnmarshalStrict([]byte(d), obj); err != nil {
			t.Fatalf("%s %s does not decode strictly: %v\n%s", head.Kind, head.Metadata.Name, err, d)
		}
		objs[head.Kind+"/"+head.Metadata.Name] = obj
	}
	return objs
}

// gpuConfig decodes a converted opaque config with the agent's decoder.
func gpuConfig(t *testing.T, o *resourceapi.OpaqueDeviceConfiguration) *gpuv1alpha1.GpuConfig {
	t.Helper()
	if o.Driver != "gpu.hwdra.io" {
		t.Fatalf("driver %q", o.Driver)
	}
	obj, err := api.Decode(o.Parameters.Raw)
	if err != nil {
		t.Fatalf("%v: %s", err, o.Parameters.Raw)
	}
	return obj.(*gpuv1alpha1.GpuConfig)
}

func TestConvert(t *testing.T) {
	t.Parallel()
	res := convertFiles(t, "mig-claim.yaml", "timeslicing.yaml", "mps.yaml", "deviceclass.yaml")
	if len(res.Problems) > 0 {
		t.Fatalf("problems: %v", res.Problems)
	}
	if len(res.Notes) != 1 || !strings.Contains(res.Notes[0].String(), "deviceclass.yaml: DeviceClass gpu.nvidia.com: left out: hwdra's chart installs gpu.hwdra.io") {
		t.Errorf("notes: %v", res.Notes)
	}
	if bytes.Contains(res.Output, []byte("nvidia.com/")) || bytes.Contains(res.Output, []byte("gpu.nvidia.com")) {
		t.Errorf("NVIDIA's names left in the output:\n%s", res.Output)
	}
	objs := docs(t, res.Output)

	mig := objs["ResourceClaimTemplate/two-small-migs"].(*resourceapi.ResourceClaimTemplate).Spec.Spec.Devices
	if got := mig.Requests[0].Exactly; got.DeviceClassName != "mig.gpu.hwdra.io" || got.Selectors[0].CEL.Expression != `device.attributes["gpu.hwdra.io"].profile == "1g.10gb"` {
		t.Errorf("MIG request: %+v", got)
	}
	if got := mig.Requests[1].FirstAvailable[0]; got.DeviceClassName != "mig.gpu.hwdra.io" || got.Selectors[0].CEL.Expression != `"profile" in device.attributes["gpu.hwdra.io"] && device.attributes["gpu.hwdra.io"]["profile"] == "1g.10gb"` {
		t.Errorf("MIG subrequest: %+v", got)
	}
	if got := *mig.Constraints[0].MatchAttribute; got != "gpu.hwdra.io/parentUUID" {
		t.Errorf("constraint: %s", got)
	}

	ts := objs["ResourceClaim/sliced-gpu"].(*resourceapi.ResourceClaim).Spec.Devices
	if c := gpuConfig(t, ts.Config[0].Opaque); c.Sharing.Strategy != gpuv1alpha1.TimeSlicing || c.Sharing.TimeSlicing.Interval != gpuv1alpha1.IntervalLong {
		t.Errorf("time-slicing config: %+v", c.Sharing)
	}
	sel := ts.Requests[0].Exactly.Selectors[0].CEL.Expression
	for _, want := range []string{`device.attributes["gpu.hwdra.io"].architecture == "hopper"`, `device.attributes["gpu.hwdra.io"].cudaComputeCapability.compareTo(semver("9.0.0")) >= 0`, `device.capacity["gpu.hwdra.io"].memory.compareTo(quantity("40Gi")) >= 0`} {
		if !strings.Contains(sel, want) {
			t.Errorf("selector %q lacks %q", sel, want)
		}
	}
	if tol := ts.Requests[0].Exactly.Tolerations[0]; tol.Key != "gpu.hwdra.io/unhealthy" || tol.Value != "XID48" {
		t.Errorf("toleration: %+v", tol)
	}

	mps := objs["ResourceClaimTemplate/mps-gpu"].(*resourceapi.ResourceClaimTemplate).Spec.Spec.Devices
	if c := gpuConfig(t, mps.Config[0].Opaque); c.Sharing.Strategy != gpuv1alpha1.MPS || *c.Sharing.MPS.DefaultActiveThreadPercentage != 50 || c.Sharing.MPS.DefaultPinnedDeviceMemoryLimit.String() != "10Gi" {
		t.Errorf("MPS config: %+v", c.Sharing.MPS)
	}
	// Documents that change nothing are written as they were, comments
	// and all.
	pod, _ := os.ReadFile("testdata/mps.yaml")
	if i := bytes.Index(pod, []byte("# The pod")); !bytes.Contains(res.Output, bytes.TrimSpace(pod[i:])) {
		t.Errorf("the pod is not written as it was")
	}
	if objs["Pod/two-clients"].(*corev1.Pod).Spec.ResourceClaims[0].ResourceClaimTemplateName == nil {
		t.Error("the pod lost its claim template")
	}

	class := objs["DeviceClass/mig-mps.example.com"].(*resourceapi.DeviceClass).Spec
	if got := class.Selectors[0].CEL.Expression; !strings.Contains(got, `device.driver == "gpu.hwdra.io"`) || !strings.Contains(got, `has(device.attributes["gpu.hwdra.io"].parentUUID)`) {
		t.Errorf("class selector: %s", got)
	}
	if c := gpuConfig(t, class.Config[0].Opaque); c.Sharing.Strategy != gpuv1alpha1.MPS || *c.Sharing.MPS.DefaultActiveThreadPercentage != 25 {
		t.Errorf("class config: %+v", c.Sharing)
	}
	vm := objs["DeviceClass/vm-gpu.example.com"].(*resourceapi.DeviceClass).Spec.Selectors[0].CEL.Expression
	if !strings.Contains(vm, `.type == "passthrough"`) || !strings.Contains(vm, `.pciDeviceID == "2330"`) {
		t.Errorf("passthrough class selector: %s", vm)
	}
}

// TestConvertedClaimsRunInLab: the converted claims and templates are
// allocated and prepared by the lab on a mock DGX H100, each file's as
// one pod's.
func TestConvertedClaimsRunInLab(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var files []string
	for _, name := range []string{"mig-claim.yaml", "timeslicing.yaml", "mps.yaml"} {
		res := convertFiles(t, name)
		var claims []string
		for _, d := range strings.Split(string(res.Output), "\n---\n") {
			if strings.Contains(d, "kind: ResourceClaim") {
				claims = append(claims, d)
			}
		}
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(strings.Join(claims, "\n---\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	var out bytes.Buffer
	if err := lab.Run(context.Background(), &out, lab.Options{Hardware: "mock:dgx-h100", ClaimFiles: files}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	// The lab shows no time slice yet: that the claim prepared is what
	// it can tell.
	for _, want := range []string{"device: gpu-0000-1b-00-0-mig-1g-10gb-6", "device: gpu-0000-1b-00-0-mig-1g-10gb-5", "gpu.hwdra.io/claim=lab-ts-test-sliced-gpu", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("lab output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestConvertRefuses(t *testing.T) {
	t.Parallel()
	res := convertFiles(t, "computedomain.yaml", "unmapped.yaml")
	want := []string{
		"testdata/computedomain.yaml: ComputeDomain nvl/training-domain: ComputeDomains (IMEX channels",
		"testdata/computedomain.yaml: Deployment nvl/trainer: spec.template.spec.resourceClaims[0].resourceClaimTemplateName: training-channel is a ComputeDomain's channel template",
		"testdata/computedomain.yaml: ResourceClaim nvl/daemon: spec.devices.requests[0].exactly.deviceClassName: compute-domain-daemon.nvidia.com: ComputeDomains",
		"testdata/unmapped.yaml: ResourceClaim odd/by-brand: spec.devices.requests[0].exactly.selectors[0].cel.expression: attribute gpu.nvidia.com/brand has no equivalent",
		"testdata/unmapped.yaml: ResourceClaim odd/by-brand: spec.devices.requests[0].exactly.selectors[1].cel.expression: attribute gpu.nvidia.com/colour: not one NVIDIA's driver publishes",
		"testdata/unmapped.yaml: ResourceClaim odd/by-brand: spec.devices.requests[0].exactly.selectors[2].cel.expression: cannot parse the expression",
		"testdata/unmapped.yaml: ResourceClaim odd/by-brand: spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: hwdra's MPS limit is one",
	}
	if len(res.Problems) != len(want) {
		t.Errorf("%d problems, want %d: %v", len(res.Problems), len(want), res.Problems)
	}
	for i, w := range want {
		if i < len(res.Problems) && !strings.HasPrefix(res.Problems[i].String(), w) {
			t.Errorf("problem %d:\n got %s\nwant %s...", i, res.Problems[i], w)
		}
	}
	// What maps is converted all the same; what does not stays as written.
	out := string(res.Output)
	for _, s := range []string{"kind: ComputeDomain", "deviceClassName: compute-domain-daemon.nvidia.com", "defaultPinnedDeviceMemoryLimit: 8Gi", "deviceClassName: gpu.hwdra.io"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
	i := strings.Index(out, "kind: ResourceClaim\nmetadata:\n  name: by-brand")
	var rc resourceapi.ResourceClaim
	if err := yaml.UnmarshalStrict([]byte(out[strings.LastIndex(out[:i], "---")+3:]), &rc); err != nil {
		t.Fatal(err)
	}
	if got := rc.Spec.Devices.Requests[0].Exactly.Selectors[0].CEL.Expression; got != `device.attributes["gpu.nvidia.com"].brand == "Nvidia" && device.attributes["gpu.hwdra.io"].productName.startsWith("NVIDIA H100")` {
		t.Errorf("partly converted selector: %s", got)
	}
	if strings.Contains(out, "defaultPerDevicePinnedMemoryLimit") {
		t.Errorf("the per-device limits are written:\n%s", out)
	}
}

func TestRewriteCEL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, out, why string }{
		{in: `device.driver == "gpu.example.com"`, out: `device.driver == "gpu.example.com"`},
		{in: `device.driver != 'gpu.nvidia.com'`, out: `device.driver != "gpu.hwdra.io"`},
		{in: `device.attributes["gpu.nvidia.com"].numa == 1`, out: `device.attributes["resource.kubernetes.io"].numaNode == 1`},
		{in: `"uuid" in device.attributes["gpu.nvidia.com"]`, out: `"uuid" in device.attributes["gpu.hwdra.io"]`},
		{in: `device.attributes["gpu.nvidia.com"]["type"] == "vfio"`, out: `device.attributes["gpu.hwdra.io"]["type"] == "passthrough"`},
		{in: `device.capacity["gpu.nvidia.com"].multiprocessors > 60`, out: `device.capacity["gpu.hwdra.io"].multiprocessors > 60`},
		{in: `device.capacity["gpu.nvidia.com"].memorySlice3 == 1`, why: "capacity gpu.nvidia.com/memorySlice3 has no equivalent"},
		{in: `device.attributes["gpu.nvidia.com"].minor == 0`, why: "attribute gpu.nvidia.com/minor has no equivalent"},
		{in: `size(device.attributes["gpu.nvidia.com"]) > 0`, why: `"gpu.nvidia.com" is used in a form hwdra convert does not rewrite`},
		{in: `device.driver == "compute-domain.nvidia.com"`, why: "ComputeDomains"},
	} {
		out, whys := rewriteCEL(tc.in)
		if tc.why != "" {
			if len(whys) != 1 || !strings.Contains(whys[0], tc.why) {
				t.Errorf("%s: problems %q, want one with %q", tc.in, whys, tc.why)
			}
			continue
		}
		if len(whys) > 0 || out != tc.out {
			t.Errorf("%s:\n got %s %q\nwant %s", tc.in, out, whys, tc.out)
		}
	}
}

// TestConvertV1beta1: a v1beta1 claim (a request's fields at its top)
// comes out as v1.
func TestConvertV1beta1(t *testing.T) {
	t.Parallel()
	in := `apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaim
metadata: {name: old}
spec:
  devices:
    requests:
    - name: gpu
      deviceClassName: gpu.nvidia.com
`
	res, err := Convert([]Input{{Name: "old.yaml", Data: []byte(in)}})
	if err != nil || len(res.Problems) > 0 {
		t.Fatal(err, res.Problems)
	}
	rc := docs(t, res.Output)["ResourceClaim/old"].(*resourceapi.ResourceClaim)
	if rc.APIVersion != "resource.k8s.io/v1" || rc.Spec.Devices.Requests[0].Exactly.DeviceClassName != "gpu.hwdra.io" {
		js, _ := json.Marshal(rc)
		t.Errorf("%s", js)
	}
}
