// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/internal/tools/claimspec"
)

// runLab runs the lab on mock:dgx-h100 with manifests given inline, one
// file each, and returns its output.
func runLab(t *testing.T, manifests ...string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	var files []string
	for i, m := range manifests {
		p := filepath.Join(dir, string(rune('a'+i))+".yaml")
		if err := os.WriteFile(p, []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	var out bytes.Buffer
	err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ClaimFiles: files})
	return out.String(), err
}

const mixedManifest = `apiVersion: v1
kind: Namespace
metadata: {name: team}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: team}
data: {a: b}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: team}
spec:
  spec:
    devices:
      requests: [{name: gpu, exactly: {deviceClassName: gpu.hwdra.io}}]
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: shared-nic, namespace: team}
spec:
  devices:
    requests: [{name: nic, exactly: {deviceClassName: vf-share.sriov.hwdra.io}}]
---
apiVersion: v1
kind: Pod
metadata: {name: worker, namespace: team}
spec:
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: one-gpu}
  - {name: nic, resourceClaimName: shared-nic}
  containers:
  - name: c
    image: x
    resources: {claims: [{name: gpu}, {name: nic}]}
---
apiVersion: v1
kind: Pod
metadata: {name: helper, namespace: team}
spec:
  resourceClaims: [{name: nic, resourceClaimName: shared-nic}]
  containers: [{name: c, image: x}]
---
apiVersion: v1
kind: Service
metadata: {name: svc, namespace: team}
spec: {ports: [{port: 80}]}
`

// TestLabTakesKubectlManifests: a file as kubectl takes it: kinds the lab
// does not use are each named as skipped; the pod gets a claim of its
// own from the template and the claim it names; a second pod naming the
// same claim shares it (allocated once).
func TestLabTakesKubectlManifests(t *testing.T) {
	out, err := runLab(t, mixedManifest)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	wantOutput(t, out,
		"== Manifests ==",
		"a.yaml, document 1: Namespace team: skipped (the lab reads ResourceClaims, ResourceClaimTemplates, DeviceClasses, Pods and the pods of",
		"a.yaml, document 2: ConfigMap team/settings: skipped",
		"a.yaml, document 7: Service team/svc: skipped",
		"a.yaml, document 5: Pod team/worker: claims worker-gpu-",
		"(from ResourceClaimTemplate one-gpu), shared-nic (ResourceClaim)",
		"a.yaml, document 6: Pod team/helper: claims shared-nic (ResourceClaim, allocated with ",
		"shared-nic: unprepared",
	)
	if n := len(regexp.MustCompile(`(?m)^worker-gpu-[a-z0-9]{5}: unprepared`).FindAllString(out, -1)); n != 1 {
		t.Errorf("the pod's claim from the template unprepared %d times, want 1", n)
	}
	if n := strings.Count(out, "shared-nic: unprepared"); n != 1 {
		t.Errorf("the shared claim unprepared %d times, want once", n)
	}
	if t.Failed() {
		t.Log(out)
	}
}

// TestLabWorkloads: a Deployment of 3 replicas is three pods, each with a
// claim of its own from the template, on three MIG devices; a Job runs
// its parallelism's pods (at most its completions), a CronJob its job's,
// a StatefulSet's pods are numbered.
func TestLabWorkloads(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ClaimFiles: []string{filepath.Join("..", "..", "..", "docs", "examples", "training.yaml")}}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	pods := regexp.MustCompile(`document 3: Pod training/(trainer-[a-z0-9]{5}-[a-z0-9]{5}) \(of Deployment training/trainer\): claims (trainer-[a-z0-9]{5}-[a-z0-9]{5}-mig-[a-z0-9]{5}) \(from ResourceClaimTemplate mig-small\)`).FindAllStringSubmatch(out.String(), -1)
	claims := map[string]bool{}
	for _, p := range pods {
		if !strings.HasPrefix(p[2], p[1]+"-mig-") {
			t.Errorf("claim %s is not named after its pod %s", p[2], p[1])
		}
		claims[p[2]] = true
		wantOutput(t, out.String(), p[2]+": unprepared")
	}
	if len(pods) != 3 || len(claims) != 3 {
		t.Errorf("%d pods, %d claims, want 3 each", len(pods), len(claims))
	}
	if n := len(regexp.MustCompile(`(?m)^- device: gpu-[0-9a-f-]+-mig-1g-10gb-\d+$`).FindAllString(out.String(), -1)); n != 3 {
		t.Errorf("%d MIG devices allocated, want 3", n)
	}
	if t.Failed() {
		t.Log(out.String())
	}

	template := `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: gpu}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.hwdra.io}}]}}}
`
	podSpec := `{resourceClaims: [{name: gpu, resourceClaimTemplateName: gpu}], restartPolicy: Never, containers: [{name: c, image: x}]}`
	got, err := runLab(t, template+`---
apiVersion: batch/v1
kind: Job
metadata: {name: batch}
spec: {parallelism: 2, completions: 5, template: {spec: `+podSpec+`}}
---
apiVersion: batch/v1
kind: Job
metadata: {name: once}
spec: {parallelism: 4, completions: 1, template: {spec: `+podSpec+`}}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec: {schedule: "0 3 * * *", jobTemplate: {spec: {template: {spec: `+podSpec+`}}}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec: {replicas: 2, serviceName: db, selector: {matchLabels: {a: b}}, template: {metadata: {labels: {a: b}}, spec: `+strings.Replace(podSpec, "restartPolicy: Never, ", "", 1)+`}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: idle}
spec: {replicas: 0, selector: {matchLabels: {a: b}}, template: {metadata: {labels: {a: b}}, spec: `+strings.Replace(podSpec, "restartPolicy: Never, ", "", 1)+`}}
`)
	if err != nil {
		t.Fatalf("%v\n%s", err, got)
	}
	for want, n := range map[string]int{"(of Job default/batch)": 2, "(of Job default/once)": 1, "(of CronJob default/nightly)": 1,
		"Pod default/db-0 (of StatefulSet default/db)": 1, "Pod default/db-1 (of StatefulSet default/db)": 1} {
		if c := strings.Count(got, want); c != n {
			t.Errorf("%q %d times, want %d", want, c, n)
		}
	}
	wantOutput(t, got, "document 6: Deployment idle: runs no pod (0 replicas)", "db-0-gpu-", "db-1-gpu-")
	if n := len(regexp.MustCompile(`(?m)^\S+-gpu-[a-z0-9]{5}: unprepared`).FindAllString(got, -1)); n != 6 {
		t.Errorf("%d claims unprepared, want 6 (2 + 1 + 1 + 2)", n)
	}
	if t.Failed() {
		t.Log(got)
	}
}

// TestLabConvertsBetaClaims: v1beta1 and v1beta2 claims and templates are
// read as the API server converts them to v1, and said so.
func TestLabConvertsBetaClaims(t *testing.T) {
	out, err := runLab(t, `apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaim
metadata: {name: old-two-gpus}
spec:
  devices:
    requests:
    - name: gpus
      deviceClassName: gpu.hwdra.io
      count: 2
      selectors: [{cel: {expression: 'device.attributes["gpu.hwdra.io"].profile == "full"'}}]
`, `apiVersion: resource.k8s.io/v1beta2
kind: ResourceClaim
metadata: {name: newer-mig}
spec:
  devices:
    requests:
    - name: mig
      exactly: {deviceClassName: mig.gpu.hwdra.io, selectors: [{cel: {expression: 'device.attributes["gpu.hwdra.io"].profile == "1g.10gb"'}}]}
`, `apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata: {name: pick}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        firstAvailable:
        - {name: small, deviceClassName: mig.gpu.hwdra.io, selectors: [{cel: {expression: 'device.attributes["gpu.hwdra.io"].profile == "2g.20gb"'}}]}
        - {name: big, deviceClassName: gpu.hwdra.io}
---
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  resourceClaims: [{name: gpu, resourceClaimTemplateName: pick}]
  containers: [{name: c, image: x}]
`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	wantOutput(t, out,
		"a.yaml, document 1: ResourceClaim old-two-gpus: resource.k8s.io/v1beta1, converted to resource.k8s.io/v1 as the API server does",
		"b.yaml, document 1: ResourceClaim newer-mig: resource.k8s.io/v1beta2, converted",
		"c.yaml, document 1: ResourceClaimTemplate pick: resource.k8s.io/v1beta1, converted",
		"old-two-gpus: unprepared", "newer-mig: unprepared", "request: gpu/small",
	)
	if n := strings.Count(out, "pool: lab\n  request: gpus\n"); n != 2 {
		t.Errorf("the v1beta1 claim got %d devices, want 2", n)
	}
	if t.Failed() {
		t.Log(out)
	}
}

// TestConvert: every field of a claim's spec survives the conversion,
// into the place v1 has it.
func TestConvert(t *testing.T) {
	want := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{
			{Name: "a", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: "c", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2, AdminAccess: ptr.To(true),
				Selectors:         []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: "true"}}},
				Tolerations:       []resourceapi.DeviceToleration{{Key: "k", Operator: resourceapi.DeviceTolerationOpEqual, Value: "v", Effect: resourceapi.DeviceTaintEffectNoSchedule, TolerationSeconds: ptr.To[int64](5)}},
				Capacity:          &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"x/bw": resource.MustParse("10G")}},
				DerivedAttributes: []resourceapi.DeviceDerivedAttribute{{Name: "x/y", Expression: "1"}},
			}},
			{Name: "b", FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "s", DeviceClassName: "c", AllocationMode: resourceapi.DeviceAllocationModeAll,
				Tolerations: []resourceapi.DeviceToleration{{Operator: resourceapi.DeviceTolerationOpExists}}}}},
		},
		Constraints: []resourceapi.DeviceConstraint{{Requests: []string{"a", "b"}, MatchAttribute: ptr.To[resourceapi.FullyQualifiedName]("x/numa")},
			{DistinctAttribute: ptr.To[resourceapi.FullyQualifiedName]("x/pci")}},
		Config: []resourceapi.DeviceClaimConfiguration{{Requests: []string{"a"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "gpu.hwdra.io", Parameters: runtimeRaw(`{"kind":"GpuConfig"}`)}}}},
	}}
	v1beta1YAML := `devices:
  requests:
  - {name: a, deviceClassName: c, allocationMode: ExactCount, count: 2, adminAccess: true, selectors: [{cel: {expression: "true"}}],
     tolerations: [{key: k, operator: Equal, value: v, effect: NoSchedule, tolerationSeconds: 5}], capacity: {requests: {x/bw: 10G}},
     derivedAttributes: [{name: x/y, expression: "1"}]}
  - {name: b, firstAvailable: [{name: s, deviceClassName: c, allocationMode: All, tolerations: [{operator: Exists}]}]}
  constraints: [{requests: [a, b], matchAttribute: x/numa}, {distinctAttribute: x/pci}]
  config: [{requests: [a], opaque: {driver: gpu.hwdra.io, parameters: {"kind":"GpuConfig"}}}]
`
	var b1 resourcev1beta1.ResourceClaimSpec
	if err := yaml.UnmarshalStrict([]byte(v1beta1YAML), &b1); err != nil {
		t.Fatal(err)
	}
	got, err := claimspec.FromV1beta1(b1)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("v1beta1:\n got %+v\nwant %+v", got, want)
	}
	// v1beta2 is v1's shape: v1's YAML of want is a v1beta2 spec.
	v1YAML, err := yaml.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var b2 resourcev1beta2.ResourceClaimSpec
	if err := yaml.UnmarshalStrict(v1YAML, &b2); err != nil {
		t.Fatal(err)
	}
	if got, err := claimspec.FromV1beta2(b2); err != nil || !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("v1beta2: %v\n got %+v\nwant %+v", err, got, want)
	}
}

// TestLabDevicePluginPod: a pod written for NVIDIA's device plugin gets
// its two GPUs through the DeviceClass whose extendedResourceName is
// nvidia.com/gpu, in the claim the scheduler would make for it.
func TestLabDevicePluginPod(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ClaimFiles: []string{filepath.Join("..", "..", "..", "docs", "examples", "device-plugin-pod.yaml")}}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	got := out.String()
	wantOutput(t, got,
		"document 1: Pod default/cuda-job: claims cuda-job-extended-resources-",
		"(extended resources: container-0-request-0: 2 nvidia.com/gpu from DeviceClass gpu.hwdra.io)",
	)
	if n := strings.Count(got, "pool: lab\n  request: container-0-request-0\n"); n != 2 {
		t.Errorf("%d devices allocated for container-0-request-0, want 2", n)
	}
	if !regexp.MustCompile(`(?m)^cuda-job-extended-resources-[a-z0-9]{5}: unprepared`).MatchString(got) {
		t.Errorf("the extended resources' claim was not unprepared")
	}
	if t.Failed() {
		t.Log(got)
	}
}

// TestExtendedRequests: the requests are named and counted as the
// scheduler's createRequestsAndMappings does: per container and resource,
// the resource's index among the container's sorted requests; an init
// container's ask reuses the later containers' requests, and only the
// largest such ask is a request.
func TestExtendedRequests(t *testing.T) {
	gpu := corev1.ResourceName("nvidia.com/gpu")
	limits := func(n int64) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{gpu: *resource.NewQuantity(n, resource.DecimalSI), corev1.ResourceCPU: resource.MustParse("1")}}
	}
	always := corev1.ContainerRestartPolicyAlways
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{
			{Name: "init-small", Resources: limits(1)},
			{Name: "init-big", Resources: limits(4)},
			{Name: "sidecar", Resources: limits(1), RestartPolicy: &always},
		},
		Containers: []corev1.Container{{Name: "main", Resources: limits(2)}, {Name: "none"}},
	}}
	var requests []corev1.ResourceList
	for _, c := range allContainers(pod) {
		requests = append(requests, c.Resources.Limits)
	}
	reqs, _ := extendedRequests(pod, requests, map[corev1.ResourceName]string{gpu: "gpu.hwdra.io"})
	var got []string
	for _, r := range reqs {
		got = append(got, r.Name+"="+resource.NewQuantity(r.Exactly.Count, resource.DecimalSI).String())
	}
	// cpu sorts before nvidia.com/gpu: the GPU is request 1. init-big
	// needs 4, of which the sidecar's 1 and main's 2 are there: 1 more.
	if want := "container-1-request-1=1 container-2-request-1=1 container-3-request-1=2"; strings.Join(got, " ") != want {
		t.Errorf("requests %s, want %s", strings.Join(got, " "), want)
	}
}

// TestLabBadManifests: every bad input names the file, the object and
// the field.
func TestLabBadManifests(t *testing.T) {
	pod := func(claims, resources string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  resourceClaims: " + claims + "\n  containers: [{name: c, image: x" + resources + "}]\n"
	}
	cases := map[string]struct {
		manifests []string
		want      string
	}{
		"a claim in none of the files": {[]string{pod("[{name: gpu, resourceClaimName: nowhere}]", "")},
			"a.yaml, document 1: Pod default/p: spec.resourceClaims[0].resourceClaimName: ResourceClaim default/nowhere is in none of the files given"},
		"a template in another namespace": {[]string{strings.Replace(mixedManifest, "metadata: {name: worker, namespace: team}", "metadata: {name: worker}", 1)},
			"a.yaml, document 5: Pod default/worker: spec.resourceClaims[0].resourceClaimTemplateName: ResourceClaimTemplate default/one-gpu is in none of the files given (there is one in namespace team: a pod takes claims of its own namespace only)"},
		"a Deployment's template missing": {[]string{"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, namespace: ns}\nspec: {selector: {matchLabels: {a: b}}, template: {metadata: {labels: {a: b}}, spec: {resourceClaims: [{name: g, resourceClaimTemplateName: t}], containers: [{name: c, image: x}]}}}\n"},
			"a.yaml, document 1: Deployment ns/d: spec.template.spec.resourceClaims[0].resourceClaimTemplateName: ResourceClaimTemplate ns/t is in none of the files given"},
		"both names": {[]string{pod("[{name: gpu, resourceClaimName: a, resourceClaimTemplateName: b}]", "")},
			"Pod default/p: spec.resourceClaims[0]: must specify one of: `resourceClaimName`, `resourceClaimTemplateName`"},
		"a container's claim the pod lacks": {[]string{pod("[]", ", resources: {claims: [{name: gpu}]}")},
			`Pod default/p: spec.containers[0].resources.claims[0].name: "gpu": must be the name of one entry in spec.resourceClaims`},
		"an extended resource no class serves": {[]string{pod("[]", ", resources: {limits: {nvidia.com/mig-1g.10gb: 1}}")},
			"a.yaml, document 1: Pod default/p: spec.containers[0].resources.limits[nvidia.com/mig-1g.10gb]: no DeviceClass has extendedResourceName nvidia.com/mig-1g.10gb"},
		"a fraction of a GPU": {[]string{pod("[]", ", resources: {requests: {nvidia.com/gpu: 500m}}")},
			"spec.containers[0].resources.requests[nvidia.com/gpu]: 500m: must be an integer"},
		"a typo of a built-in kind": {[]string{"apiVersion: v1\nkind: Pood\nmetadata: {name: p}\n"}, "a.yaml, document 1: Pood p: no kind Pood in v1"},
		"no kind":                   {[]string{"apiVersion: v1\nmetadata: {name: p}\n"}, `a.yaml, document 1: apiVersion "v1", kind "": want both`},
		"an unknown field of a pod": {[]string{pod("[]", ", resourcez: {}")}, `a.yaml, document 1: Pod p: unknown field "spec.containers[0].resourcez"`},
		"a bad v1beta1 claim": {[]string{"apiVersion: resource.k8s.io/v1beta1\nkind: ResourceClaim\nmetadata: {name: b}\nspec: {devices: {requests: [{name: g, deviceClassName: gpu.hwdra.io, count: -1}]}}\n"},
			"a.yaml, document 1: ResourceClaim b: ResourceClaim \"b\" is invalid:\n  spec.devices.requests[0].exactly.count: Invalid value: -1: must be greater than zero"},
		"a claim twice": {[]string{claimYAML("x", "exactly: {deviceClassName: gpu.hwdra.io}"), claimYAML("x", "exactly: {deviceClassName: gpu.hwdra.io}")},
			"b.yaml, document 1: ResourceClaim default/x already read from "},
		"only skipped kinds": {[]string{"apiVersion: v1\nkind: Namespace\nmetadata: {name: ns}\n"}, "nothing to allocate"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			out, err := runLab(t, tc.manifests...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want error containing %q, got %v\n%s", tc.want, err, out)
			}
		})
	}
}

func runtimeRaw(s string) runtime.RawExtension { return runtime.RawExtension{Raw: []byte(s)} }

// TestLabList: kubectl's List (what `kubectl get -o yaml` writes): each
// item on its own, named by its index.
func TestLabList(t *testing.T) {
	out, err := runLab(t, `apiVersion: v1
kind: List
items:
- {apiVersion: resource.k8s.io/v1, kind: ResourceClaim, metadata: {name: g}, spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.hwdra.io}}]}}}
- {apiVersion: v1, kind: Pod, metadata: {name: p}, spec: {resourceClaims: [{name: gpu, resourceClaimName: g}], containers: [{name: c, image: x}]}}
- {apiVersion: v1, kind: ConfigMap, metadata: {name: cm}}
`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	wantOutput(t, out, "a.yaml, document 1, items[1]: Pod default/p: claims g (ResourceClaim)", "a.yaml, document 1, items[2]: ConfigMap cm: skipped", "g: unprepared")
	if t.Failed() {
		t.Log(out)
	}
}
