// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// Shared by the pods_* scenarios: real pods from ResourceClaimTemplates,
// scheduled by the real scheduler and prepared by the real kubelet through
// the agent as operators run it (the chart's DaemonSet pod, from the image
// hack/build-image.sh builds), on the shared node, with the agent pod
// started per scenario on the scenario's (mock) hardware.

const (
	gpuDriver = "gpu.hwdra.io"
	nicDriver = "sriov.hwdra.io"

	podRunningTimeout = 90 * time.Second
)

// scenario is one pod scenario: the agent on its hardware, a namespace, and
// the node left free when the test ends.
type scenario struct {
	t     *testing.T
	n     *framework.Node
	ns    string
	ctx   context.Context
	agent *framework.AgentPod
}

// startScenario starts the agent pod on hardware on the shared node
// (ready: both plugins registered with the kubelet, every driver's slices
// in the API server, the NRI plugin synchronized with containerd), waits
// until each of drivers has published all of its slices, and makes a
// namespace. When t ends, pass or fail, every pod and claim of the
// namespace is deleted and gone (unprepared by the agent, deallocated)
// before the agent stops.
func startScenario(t *testing.T, name, hardware string, drivers ...string) *scenario {
	t.Helper()
	return startScenarioWith(t, name, hardware, nil, drivers...)
}

// startScenarioWith is startScenario with the chart's config value (nil:
// the chart's default).
func startScenarioWith(t *testing.T, name, hardware string, config map[string]any, drivers ...string) *scenario {
	t.Helper()
	var values map[string]any
	if config != nil {
		values = map[string]any{"config": config}
	}
	return startScenarioValues(t, name, hardware, values, drivers...)
}

// startScenarioValues is startScenario with more of the chart's values
// (each top-level value given replaces the suite's).
func startScenarioValues(t *testing.T, name, hardware string, more map[string]any, drivers ...string) *scenario {
	t.Helper()
	n := framework.Shared(t)
	ctx := context.Background()
	since := n.KubeletLogSize()
	values := n.AgentPodValues(t, hardware)
	maps.Copy(values, more)
	agent := n.StartAgentPod(t, values)
	for _, d := range drivers {
		if _, err := n.WaitPoolsComplete(ctx, d, 60*time.Second); err != nil {
			t.Fatal(err)
		}
		// Else the first pod may wait for the kubelet's retry (seconds).
		// Not fatal: it is read from the kubelet's log, and a pod runs
		// anyway, later.
		if err := n.WaitDriverRegistered(ctx, d, since, 15*time.Second); err != nil {
			t.Logf("NOTE: %v; the first pod may wait for the kubelet's retry", err)
		}
	}
	ns := n.CreateNamespace(t, name)
	// Registered after StartAgentPod, so it runs before the agent stops: the
	// kubelet unprepares the claims through it.
	t.Cleanup(func() {
		if err := n.DeletePodsAndClaims(context.Background(), ns, 90*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return &scenario{t: t, n: n, ns: ns, ctx: ctx, agent: agent}
}

// template creates a ResourceClaimTemplate from claim (named like it).
func (s *scenario) template(claim *resourceapi.ResourceClaim) string {
	s.t.Helper()
	tmpl := framework.TemplateFor(claim)
	if _, err := s.n.Admin.ResourceV1().ResourceClaimTemplates(s.ns).Create(s.ctx, tmpl, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	return tmpl.Name
}

// createPod creates a test-app pod whose claim "devices" comes from the
// template; the app shows paths. It returns when the pod was created.
func (s *scenario) createPod(name, template string, paths ...string) time.Time {
	s.t.Helper()
	return s.createPodFor(framework.PodWithClaimTemplate(name, template, paths...))
}

// ran is a pod that runs: its claim as allocated and its app's output.
type ran struct {
	pod    *corev1.Pod
	claim  *resourceapi.ResourceClaim
	out    framework.AppOutput
	logs   string
	timing time.Duration
}

// waitRunning waits until the pod runs, logs "TIMING <scenario> <since ->
// Running>", and returns its claim and the app's output.
func (s *scenario) waitRunning(name, timing string, since time.Time) ran {
	s.t.Helper()
	pod, err := s.n.WaitPodRunning(s.ctx, s.ns, name, podRunningTimeout)
	if err != nil {
		s.t.Fatal(err)
	}
	r := ran{pod: pod, timing: time.Since(since)}
	framework.Timing(s.t, timing, r.timing)
	// Its claim "devices" (made from a template, or named), or, asking by
	// extended resource, the claim the scheduler made for it.
	waitClaim := s.n.WaitPodClaimAllocated
	switch {
	case len(pod.Spec.ResourceClaims) == 0:
		waitClaim = s.n.WaitPodExtendedClaimAllocated
	case pod.Spec.ResourceClaims[0].ResourceClaimName != nil:
		// A running pod's named claim is allocated and reserved for it.
		r.claim, err = s.n.Admin.ResourceV1().ResourceClaims(s.ns).Get(s.ctx, *pod.Spec.ResourceClaims[0].ResourceClaimName, metav1.GetOptions{})
		waitClaim = nil
	}
	if waitClaim != nil {
		r.claim, _, err = waitClaim(s.ctx, s.ns, name, 10*time.Second)
	}
	if err != nil {
		s.t.Fatal(err)
	}
	if r.logs, err = s.n.WaitPodLogs(s.ctx, s.ns, name, "app", "=== END", 20*time.Second); err != nil {
		s.t.Fatal(err)
	}
	r.out = framework.ParseAppOutput(r.logs)
	return r
}

// runPod creates a pod and waits until it runs.
func (s *scenario) runPod(name, template, timing string, paths ...string) ran {
	s.t.Helper()
	return s.waitRunning(name, timing, s.createPod(name, template, paths...))
}

// waitPending waits until the scheduler reports that it cannot place the
// pod because it cannot allocate its claim, and checks that the pod stays
// Pending and its claim unallocated for a while. It returns the scheduler's
// message.
func (s *scenario) waitPending(name string) string {
	s.t.Helper()
	_, msg, err := s.n.WaitPodUnschedulable(s.ctx, s.ns, name, 30*time.Second)
	if err != nil {
		s.t.Fatal(err)
	}
	// The DRA plugin's reason (k8s.io/kubernetes
	// pkg/scheduler/framework/plugins/dynamicresources).
	if !strings.Contains(msg, "cannot allocate all claims") {
		s.t.Errorf("pod %s is unschedulable for another reason than its claim: %q", name, msg)
	}
	if err := s.n.CheckPodStaysPending(s.ctx, s.ns, name, 2*time.Second); err != nil {
		s.t.Fatal(err)
	}
	if c := s.podClaim(name); c != nil && c.Status.Allocation != nil {
		s.t.Errorf("claim %s of the pending pod %s is allocated: %+v", c.Name, name, c.Status.Allocation.Devices.Results)
	}
	return msg
}

// createPodFor creates pod and returns when it was created.
func (s *scenario) createPodFor(pod *corev1.Pod) time.Time {
	s.t.Helper()
	began := time.Now()
	if _, err := s.n.Admin.CoreV1().Pods(s.ns).Create(s.ctx, pod, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	return began
}

// podClaim is the claim generated for the pod's claim "devices", or the
// one the scheduler made for its extended resources, or nil.
func (s *scenario) podClaim(name string) *resourceapi.ResourceClaim {
	s.t.Helper()
	pod, err := s.n.Admin.CoreV1().Pods(s.ns).Get(s.ctx, name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	var claim string
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.Name == "devices" && st.ResourceClaimName != nil {
			claim = *st.ResourceClaimName
		}
	}
	if st := pod.Status.ExtendedResourceClaimStatus; st != nil {
		claim = st.ResourceClaimName
	}
	if claim == "" {
		return nil
	}
	c, err := s.n.Admin.ResourceV1().ResourceClaims(s.ns).Get(s.ctx, claim, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// deletePod deletes a pod and waits until it is gone.
func (s *scenario) deletePod(name string) {
	s.t.Helper()
	if err := s.n.DeletePod(s.ctx, s.ns, name, 60*time.Second); err != nil {
		s.t.Fatal(err)
	}
}

// result is the claim's only allocation result for request.
func result(t *testing.T, claim *resourceapi.ResourceClaim, request string) resourceapi.DeviceRequestAllocationResult {
	t.Helper()
	var found []resourceapi.DeviceRequestAllocationResult
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Request == request {
			found = append(found, r)
		}
	}
	if len(found) != 1 {
		t.Fatalf("claim %s: %d results for request %q, want 1: %+v", claim.Name, len(found), request, claim.Status.Allocation.Devices.Results)
	}
	return found[0]
}

// exampleClaim reads deploy/examples/<file>.
func exampleClaim(t *testing.T, file string) *resourceapi.ResourceClaim {
	t.Helper()
	c, err := framework.ExampleClaim(file)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkCDI checks that the container got every device node (with its
// numbers) and environment variable of the CDI spec the driver wrote for
// the claim, and returns the spec (nil when the driver wrote none).
func checkCDI(t *testing.T, n *framework.Node, driver string, r ran) *cdispec.Spec {
	t.Helper()
	spec, err := n.ClaimCDISpec(driver, r.claim.UID)
	if err != nil {
		t.Fatal(err)
	}
	if spec == nil {
		return nil
	}
	if len(spec.Devices) == 0 {
		t.Errorf("CDI spec of %s for claim %s has no device", driver, r.claim.Name)
	}
	for _, missing := range r.out.MissingEdits(spec.ContainerEdits) {
		t.Errorf("pod %s, %s CDI spec (spec-wide edits): %s", r.pod.Name, driver, missing)
	}
	for _, d := range spec.Devices {
		for _, missing := range r.out.MissingEdits(d.ContainerEdits) {
			t.Errorf("pod %s, %s CDI device %s: %s", r.pod.Name, driver, d.Name, missing)
		}
	}
	return spec
}

// metadataDevice decodes the KEP-5304 metadata file of driver for the
// pod's request from the container's own output, checks that every
// document (one per API version) names the allocated result, and returns
// the device's attributes (of the first, newest, document).
func metadataDevice(t *testing.T, r ran, res resourceapi.DeviceRequestAllocationResult) map[string]map[string]any {
	t.Helper()
	// The top-level request: a subrequest's metadata is filed under it.
	request, _, _ := strings.Cut(res.Request, "/")
	path := framework.MetadataPath("devices", request, res.Driver)
	data, ok := r.out.Files[path]
	if !ok {
		t.Fatalf("pod %s: no metadata file %s (missing: %v)\n%s", r.pod.Name, path, r.out.Missing, r.logs)
	}
	docs, err := framework.DecodeMetadata(data)
	if err != nil || len(docs) == 0 {
		t.Fatalf("pod %s: metadata %s: %v (%d documents)\n%s", r.pod.Name, path, err, len(docs), data)
	}
	var attrs map[string]map[string]any
	for i, d := range docs {
		if len(d.Requests) != 1 || d.Requests[0].Name != res.Request || len(d.Requests[0].Devices) != 1 {
			t.Errorf("pod %s: metadata %s (%s) does not hold exactly request %s with one device: %+v", r.pod.Name, path, d.APIVersion, res.Request, d)
			continue
		}
		dev := d.Requests[0].Devices[0]
		if dev.Driver != res.Driver || dev.Pool != res.Pool || dev.Name != res.Device {
			t.Errorf("pod %s: metadata %s (%s) names %s/%s/%s, allocated %s/%s/%s",
				r.pod.Name, path, d.APIVersion, dev.Driver, dev.Pool, dev.Name, res.Driver, res.Pool, res.Device)
		}
		if i == 0 {
			attrs = dev.Attributes
		}
	}
	if attrs == nil {
		t.FailNow()
	}
	return attrs
}

// attrValue is a metadata or slice attribute's value (the one of string,
// int, bool, version), looked up by its name as given, then qualified with
// driver; nil when absent.
func attrValue(attrs map[string]map[string]any, driver, name string) any {
	v, ok := attrs[name]
	if !ok {
		v = attrs[driver+"/"+name]
	}
	for _, x := range v {
		return x
	}
	return nil
}

// sliceAttr is a published device's attribute value, as a string for
// comparison ("0" for int 0), "" when absent.
func sliceAttr(d *resourceapi.Device, name resourceapi.QualifiedName) string {
	a, ok := d.Attributes[name]
	switch {
	case !ok:
		return ""
	case a.StringValue != nil:
		return *a.StringValue
	case a.IntValue != nil:
		return fmt.Sprint(*a.IntValue)
	case a.BoolValue != nil:
		return fmt.Sprint(*a.BoolValue)
	case a.VersionValue != nil:
		return *a.VersionValue
	}
	return ""
}

// waitCDISpecGone waits until the driver's CDI spec of the claim is removed
// (the claim was unprepared).
func waitCDISpecGone(t *testing.T, n *framework.Node, driver string, claim *resourceapi.ResourceClaim) {
	t.Helper()
	waitfor.NoError(t, fmt.Sprintf("CDI spec of %s for claim %s gone from %s after its pod was deleted", driver, claim.Name, n.CDIDir), 30*time.Second, func() error {
		spec, err := n.ClaimCDISpec(driver, claim.UID)
		if err == nil && spec != nil {
			err = errors.New("still there")
		}
		return err
	})
}
