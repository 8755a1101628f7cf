// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// Pods written for NVIDIA's device plugin: resources.limits
// {nvidia.com/gpu: N} and no claim. The chart's whole-GPU DeviceClass
// carries extendedResourceName nvidia.com/gpu; on this node no device
// plugin advertises it, so kube-scheduler (its dynamicresources plugin)
// makes a claim for the pod from that class, named
// <pod>-extended-resources-<random>, with one request per container,
// "container-<i>-request-<j>", allocates it and writes it into the pod's
// status.extendedResourceClaimStatus; the kubelet prepares it through the
// agent like any claim and gives the container the CDI devices of its
// request.

const (
	gpuResource = "nvidia.com/gpu"
	// extRequest is the request the scheduler makes for the first
	// container's first extended resource.
	extRequest = "container-0-request-0"
	// metadataRoot holds every device metadata file of a container.
	metadataRoot = "/var/run/kubernetes.io/dra-device-attributes"
)

// eightH100 is a node with 8 H100 GPUs, MIG off: 8 whole GPUs.
const eightH100 = `
gpus:
- model: h100-80gb
  count: 8
`

// createGPUPod creates a test-app pod asking for count nvidia.com/gpu.
func (s *scenario) createGPUPod(name string, count int64, paths ...string) time.Time {
	s.t.Helper()
	return s.createPodFor(framework.PodWithExtendedResource(name, gpuResource, count, paths...))
}

// TestPodExtendedResourceGPU: a pod asking for nvidia.com/gpu: 1 and no
// claim runs. The scheduler made its claim from gpu.hwdra.io (annotated,
// owned by the pod, request container-0-request-0, one whole GPU) and
// mapped the container to it in the pod's status; the container sees the
// GPU as our CDI spec gives it (device nodes, HWDRA_<device>_UUID, the
// UUID the slice publishes) and the device metadata file of the claim.
// Deleting the pod unprepares the claim and the claim goes. Before that,
// a pod asking for more nvidia.com/gpu than the node has stays Pending
// with the scheduler's reason.
func TestPodExtendedResourceGPU(t *testing.T) {
	s := startScenario(t, "pod-ext-gpu", framework.MockProfile(t, "eight-h100", eightH100), gpuDriver)

	s.createGPUPod("nine", 9)
	t.Logf("nvidia.com/gpu: 9 on a node of 8: %s", s.waitPending("nine"))
	s.deletePod("nine")

	created := s.createGPUPod("one", 1, "/dev", metadataRoot)
	r := s.waitRunning("one", "extended-resource-gpu", created)
	st := r.pod.Status.ExtendedResourceClaimStatus
	if st == nil || st.ResourceClaimName != r.claim.Name {
		t.Fatalf("pod status extendedResourceClaimStatus %+v, claim %s", st, r.claim.Name)
	}
	want := []corev1.ContainerExtendedResourceRequest{{ContainerName: "app", ResourceName: gpuResource, RequestName: extRequest}}
	if !reflect.DeepEqual(st.RequestMappings, want) {
		t.Errorf("request mappings %+v, want %+v", st.RequestMappings, want)
	}
	c := r.claim
	if c.Annotations[resourceapi.ExtendedResourceClaimAnnotation] != "true" || !strings.HasPrefix(c.Name, "one-extended-resources-") {
		t.Errorf("claim %s: annotations %v: not the scheduler's extended-resource claim", c.Name, c.Annotations)
	}
	if len(c.OwnerReferences) != 1 || c.OwnerReferences[0].UID != r.pod.UID {
		t.Errorf("claim %s owned by %+v, want the pod %s", c.Name, c.OwnerReferences, r.pod.UID)
	}
	if reqs := c.Spec.Devices.Requests; len(reqs) != 1 || reqs[0].Exactly == nil || reqs[0].Exactly.DeviceClassName != "gpu.hwdra.io" || reqs[0].Exactly.Count != 1 {
		t.Errorf("claim %s requests %+v, want one gpu.hwdra.io device", c.Name, reqs)
	}
	res := result(t, c, extRequest)
	published, err := s.n.PublishedDevice(s.ctx, res.Driver, res.Pool, res.Device)
	if err != nil {
		t.Fatal(err)
	}
	if p := sliceAttr(published, gpuDriver+"/profile"); p != "full" {
		t.Errorf("allocated %s of profile %q, want a whole GPU", res.Device, p)
	}
	uuid := sliceAttr(published, gpuDriver+"/uuid")
	if env := gpuEnvName(res.Device, "UUID"); uuid == "" || r.out.Env[env] != uuid {
		t.Errorf("container env %s=%q, the slice publishes uuid %q", env, r.out.Env[env], uuid)
	}
	if v := r.out.Env["NVIDIA_VISIBLE_DEVICES"]; v != "void" {
		t.Errorf("container env NVIDIA_VISIBLE_DEVICES=%q, want void (our CDI spec's)", v)
	}
	spec := checkCDI(t, s.n, gpuDriver, r)
	if spec == nil {
		t.Fatalf("no CDI spec for claim %s", c.Name)
	}
	nodes := 0
	for dev := range r.out.Devices {
		if strings.HasPrefix(dev, "/dev/nvidia") && !strings.HasPrefix(dev, "/dev/nvidia-") && dev != "/dev/nvidiactl" {
			nodes++
		}
	}
	if nodes != 1 {
		t.Errorf("container has %d GPU device nodes, want its one: %v", nodes, r.out.Devices)
	}
	checkDirectMetadata(t, r, res)
	t.Logf("pod asking for %s got %s (%s) through claim %s", gpuResource, res.Device, uuid, c.Name)

	s.deletePod("one")
	waitCDISpecGone(t, s.n, gpuDriver, c)
	waitClaimGone(t, s, c.Name)
}

// checkDirectMetadata checks the device metadata file of a claim the pod
// does not name (the scheduler's): it is filed under the claim's name.
func checkDirectMetadata(t *testing.T, r ran, res resourceapi.DeviceRequestAllocationResult) {
	t.Helper()
	path := framework.MetadataPathDirect(r.claim.Name, res.Request, res.Driver)
	data, ok := r.out.Files[path]
	if !ok {
		t.Fatalf("pod %s: no metadata file %s (missing %v, dirs %v)", r.pod.Name, path, r.out.Missing, r.out.Dirs)
	}
	docs, err := framework.DecodeMetadata(data)
	if err != nil || len(docs) == 0 {
		t.Fatalf("pod %s: metadata %s: %v\n%s", r.pod.Name, path, err, data)
	}
	for _, d := range docs {
		if len(d.Requests) != 1 || d.Requests[0].Name != res.Request || len(d.Requests[0].Devices) != 1 || d.Requests[0].Devices[0].Name != res.Device {
			t.Errorf("pod %s: metadata %s (%s) does not name request %s, device %s: %+v", r.pod.Name, path, d.APIVersion, res.Request, res.Device, d)
		}
	}
}

// waitClaimGone waits until the claim is deleted.
func waitClaimGone(t *testing.T, s *scenario, name string) {
	t.Helper()
	waitfor.True(t, "claim "+name+" gone after its pod was deleted", 60*time.Second, func() bool {
		_, err := s.n.Admin.ResourceV1().ResourceClaims(s.ns).Get(s.ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// TestPodsCompeteExtendedResourceAndClaims: on 8 GPUs, pods asking by
// extended resource (2, 1, 2 GPUs) and pods asking by claim (a whole GPU
// each, deploy/examples/gpu-full.yaml) all run, each GPU given once; then
// a ninth GPU, by either way, stays Pending with the scheduler's reason.
// Freeing a GPU held by one kind lets a pod of the other run, and still no
// GPU is given twice.
func TestPodsCompeteExtendedResourceAndClaims(t *testing.T) {
	s := startScenario(t, "compete-ext", framework.MockProfile(t, "eight-h100", eightH100), gpuDriver)
	tmpl := s.template(exampleClaim(t, "gpu-full.yaml"))
	type want struct {
		name  string
		count int64 // by extended resource; 0: by claim
	}
	winners := []want{{"ext-a", 2}, {"claim-b", 0}, {"ext-c", 1}, {"claim-d", 0}, {"ext-e", 2}, {"claim-f", 0}}
	created := map[string]time.Time{}
	create := func(w want) {
		if w.count > 0 {
			created[w.name] = s.createGPUPod(w.name, w.count)
		} else {
			created[w.name] = s.createPod(w.name, tmpl)
		}
	}
	for _, w := range winners {
		create(w)
	}
	held := map[string]string{} // device -> pod
	hold := func(r ran, w want) {
		t.Helper()
		var got []string
		for _, res := range r.claim.Status.Allocation.Devices.Results {
			if other, ok := held[res.Device]; ok {
				t.Errorf("%s and %s both hold %s", other, w.name, res.Device)
			}
			held[res.Device] = w.name
			got = append(got, res.Device)
		}
		n := max(w.count, 1)
		if int64(len(got)) != n {
			t.Errorf("%s holds %v, asked for %d", w.name, got, n)
		}
	}
	ran := map[string]ran{}
	for _, w := range winners {
		r := s.waitRunning(w.name, "compete-ext/"+w.name, created[w.name])
		ran[w.name] = r
		hold(r, w)
	}
	if len(held) != 8 {
		t.Fatalf("%d GPUs held by the running pods, want 8: %v", len(held), held)
	}
	s.createGPUPod("ext-late", 1)
	t.Logf("nvidia.com/gpu: 1 on a full node: %s", s.waitPending("ext-late"))
	s.createPod("claim-late", tmpl)
	t.Logf("a claim on a full node: %s", s.waitPending("claim-late"))

	// A claim's GPU freed: one of the two late pods runs, the other waits.
	release := func(name string) {
		for d, p := range held {
			if p == name {
				delete(held, d)
			}
		}
		s.deletePod(name)
	}
	release("claim-b")
	late := map[string]want{"ext-late": {"ext-late", 1}, "claim-late": {"claim-late", 0}}
	first := s.waitEither("ext-late", "claim-late")
	hold(s.waitRunning(first, "compete-ext/"+first+"-after-release", time.Now()), late[first])
	delete(late, first)
	var second string
	for second = range late {
	}
	if msg := s.waitPending(second); msg == "" {
		t.Errorf("%s not reported unschedulable", second)
	}
	// An extended-resource pod's two GPUs freed: the other runs.
	release("ext-a")
	hold(s.waitRunning(second, "compete-ext/"+second+"-after-release", time.Now()), late[second])
	if len(held) != 7 {
		t.Errorf("%d GPUs held, want 7: %v", len(held), held)
	}
}

// waitEither waits until one of two pods is bound to the node and says
// which.
func (s *scenario) waitEither(a, b string) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, podRunningTimeout)
	defer cancel()
	for {
		for _, name := range []string{a, b} {
			p, err := s.n.Admin.CoreV1().Pods(s.ns).Get(ctx, name, metav1.GetOptions{})
			if err == nil && p.Spec.NodeName != "" {
				return name
			}
		}
		select {
		case <-ctx.Done():
			s.t.Fatal(fmt.Errorf("neither %s nor %s bound within %v", a, b, podRunningTimeout))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// sharedResource is the device plugin's renamed time-slicing resource,
// which the chart's extendedResources.shared gives to the GPU shares.
const sharedResource = "nvidia.com/gpu.shared"

// TestPodExtendedResourceShared: with the chart's value
// extendedResources.shared nvidia.com/gpu.shared (helm installs it: the
// DeviceClass share.gpu.hwdra.io in the API names it), three pods asking
// for nvidia.com/gpu.shared: 1 and no claim run on the node's one GPU,
// each through the scheduler's claim of class share.gpu.hwdra.io: a share
// of the GPU's one share device, with the share's defaults (10% and 4Gi)
// in its container's MPS environment, all three clients of the GPU's one
// MPS daemon. Before that, a pod asking for 2 stays Pending with the
// scheduler's reason: the devices of one request are distinct, and the
// node's one GPU has one share device (unlike the device plugin's
// replicas, two of which could be one GPU's).
func TestPodExtendedResourceShared(t *testing.T) {
	values := map[string]any{"extendedResources": map[string]any{"shared": sharedResource}}
	s := startScenarioValues(t, "pod-ext-shared", framework.MockProfile(t, "one-h100", oneH100), values, gpuDriver)
	class, err := s.n.Admin.ResourceV1().DeviceClasses().Get(s.ctx, "share.gpu.hwdra.io", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := class.Spec.ExtendedResourceName; n == nil || *n != sharedResource {
		t.Fatalf("DeviceClass share.gpu.hwdra.io has extendedResourceName %v, want %s from the chart's values", n, sharedResource)
	}

	s.createPodFor(framework.PodWithExtendedResource("two", sharedResource, 2))
	t.Logf("%s: 2 on one GPU: %s", sharedResource, s.waitPending("two"))
	s.deletePod("two")

	var device, pid string
	shares := map[string]bool{}
	for _, name := range []string{"shared-a", "shared-b", "shared-c"} {
		created := s.createPodFor(framework.PodWithExtendedResource(name, sharedResource, 1, mpsPaths...))
		r := s.waitRunning(name, "extended-resource-shared", created)
		if reqs := r.claim.Spec.Devices.Requests; len(reqs) != 1 || reqs[0].Exactly == nil || reqs[0].Exactly.DeviceClassName != "share.gpu.hwdra.io" {
			t.Errorf("%s: claim %s requests %+v, want one share.gpu.hwdra.io device", name, r.claim.Name, reqs)
		}
		res := result(t, r.claim, extRequest)
		if res.ShareID == nil || !strings.HasSuffix(res.Device, "-share") || (device != "" && res.Device != device) {
			t.Errorf("%s: allocated %s (share %v), the others %s", name, res.Device, res.ShareID, device)
		}
		if res.ShareID != nil {
			if shares[string(*res.ShareID)] {
				t.Errorf("%s: share %s given twice", name, *res.ShareID)
			}
			shares[string(*res.ShareID)] = true
		}
		device = res.Device
		p := mpsClient(t, name, r, "10", "0=4096M")
		if pid != "" && p != pid {
			t.Errorf("%s reaches MPS daemon %s, the others %s", name, p, pid)
		}
		pid = p
		t.Logf("pod %s asking for %s got share %v of %s through claim %s", name, sharedResource, *res.ShareID, res.Device, r.claim.Name)
	}
}
