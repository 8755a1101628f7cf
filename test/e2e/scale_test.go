// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/hwdra/hwdra/internal/tools/allocate"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// scaleNode has a GPU in each mode (MIG off, MIG on, host vGPU) beside
// the DGX's NICs.
const scaleNode = `
gpus:
- {model: h100-80gb, count: 1, pciBusIDs: ["0000:1b:00.0"]}
- {model: h100-80gb, count: 1, pciBusIDs: ["0000:43:00.0"], mig: true}
- {model: h100-80gb, count: 1, pciBusIDs: ["0000:52:00.0"], virtualization: host-vgpu}
nics:
- {model: cx7, count: 2, vfs: 8}
`

// metricsAddress is where the agent serves /metrics in these tests.
const metricsAddress = "127.0.0.1:19464"

// oneDevice is a claim for one device of a class matching a selector.
func oneDevice(name, class, cel string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{allocate.Request("dev", class, 1, cel)}}},
	}
}

// prepareUnprepare prepares and unprepares one allocated claim through the
// driver's DRA socket, as the kubelet does, and returns how long each took.
func prepareUnprepare(ctx context.Context, t *testing.T, dra drapb.DRAPluginClient, c *resourceapi.ResourceClaim, hold func()) (prep, unprep time.Duration) {
	t.Helper()
	pb := []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}
	start := time.Now()
	res, err := dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: pb})
	prep = time.Since(start)
	if err != nil || res.Claims[string(c.UID)].Error != "" {
		t.Fatalf("prepare %s: %v %+v", c.Name, err, res)
	}
	if hold != nil {
		hold()
	}
	start = time.Now()
	un, err := dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: pb})
	unprep = time.Since(start)
	if err != nil || un.Claims[string(c.UID)].Error != "" {
		t.Fatalf("unprepare %s: %v %+v", c.Name, err, un)
	}
	return prep, unprep
}

// claimCycle creates a claim like template named name, allocates it,
// prepares and unprepares it through dra, and deletes it; it returns the
// prepare and unprepare times.
func claimCycle(ctx context.Context, t *testing.T, n *framework.Node, alloc *allocate.Allocator, ns string,
	dra drapb.DRAPluginClient, template *resourceapi.ResourceClaim, name string) (prep, unprep time.Duration) {
	t.Helper()
	c := template.DeepCopy()
	c.Name = name
	stored, err := n.CreateAllocatedClaim(ctx, alloc, ns, c)
	if err != nil {
		t.Fatalf("%s: %v", c.Name, err)
	}
	prep, unprep = prepareUnprepare(ctx, t, dra, stored, nil)
	alloc.Release(stored)
	if err := n.Admin.ResourceV1().ResourceClaims(ns).Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	return prep, unprep
}

// logPercentiles logs "TIMING prepare/<what>/p50 ..." and p90, and the same
// for unprepare.
func logPercentiles(t *testing.T, what string, prep, unprep []time.Duration) {
	t.Helper()
	for _, q := range []struct {
		name string
		p    float64
	}{{"p50", 0.5}, {"p90", 0.9}} {
		framework.Timing(t, "prepare/"+what+"/"+q.name, percentile(prep, q.p))
		framework.Timing(t, "unprepare/"+what+"/"+q.name, percentile(unprep, q.p))
	}
}

func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

// TestClaimsNeverRewriteThePoolThroughTheAPIServer: through the kubelet's
// DRA gRPC API and the real API server, 20 claims each of a whole GPU, a
// dynamic 1g.10gb, a MIG-backed vGPU, a time-sliced vGPU and a VF share
// are prepared and unprepared one after another. The API server sees no
// ResourceSlice write for any of them, and no claim GET of a prepare waits
// for the client's rate limiter. Logs each kind's prepare and unprepare
// p50 and p90 ("TIMING prepare/<kind>/p50 ...").
func TestClaimsNeverRewriteThePoolThroughTheAPIServer(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	n.StartAgent(t, framework.MockProfile(t, "scale", scaleNode), "--metrics-address="+metricsAddress)
	alloc, err := n.Allocator(ctx, gpuDriver, nicDriver)
	if err != nil {
		t.Fatal(err)
	}
	ns := n.CreateNamespace(t, "scale")
	writes, err := n.WatchSliceWrites(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gpu, nic := n.DRAClient(t, gpuDriver), n.DRAClient(t, nicDriver)
	share := oneDevice("", "vf-share.sriov.hwdra.io", "")
	share.Spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{
		Requests: map[resourceapi.QualifiedName]resource.Quantity{"sriov.hwdra.io/bandwidth": resource.MustParse("10G")},
	}
	kinds := []struct {
		name  string
		dra   drapb.DRAPluginClient
		claim *resourceapi.ResourceClaim
	}{
		{"full-gpu", gpu, oneDevice("", "gpu.hwdra.io", "")},
		{"mig-1g.10gb", gpu, oneDevice("", "mig.gpu.hwdra.io", `device.attributes["gpu.hwdra.io"].profile == "1g.10gb"`)},
		{"vgpu-mig-backed", gpu, oneDevice("", "vgpu.gpu.hwdra.io", `device.attributes["gpu.hwdra.io"].migBacked`)},
		{"vgpu-time-sliced", gpu, oneDevice("", "vgpu.gpu.hwdra.io", `!device.attributes["gpu.hwdra.io"].migBacked`)},
		{"vf-share-10g", nic, share},
	}
	const perKind = 20
	for _, k := range kinds {
		var prep, unprep []time.Duration
		for i := range perKind {
			p, u := claimCycle(ctx, t, n, alloc, ns, k.dra, k.claim, fmt.Sprintf("%s-%d", k.name, i))
			prep, unprep = append(prep, p), append(unprep, u)
		}
		logPercentiles(t, k.name, prep, unprep)
	}
	// A rescan after the last claim publishes nothing either: the agent
	// rescans every minute, a link change at once; a write would come
	// from the resourceslice controller, which ticks within 2 s: real
	// time passes to show none comes, watched throughout.
	waitfor.Never(t, "a ResourceSlice write for the claims", 2*time.Second, func() bool {
		for _, d := range []string{gpuDriver, nicDriver} {
			if got := writes.Count(d); got != 0 {
				t.Errorf("%s: %d ResourceSlice writes for %d claims of each kind: %v", d, got, perKind, writes.Events())
				return true
			}
		}
		return false
	})
	// Where a prepare's time goes: the agent's own part (plan, hardware,
	// checkpoint, CDI spec) against the whole call above (plus the claim
	// GET, the metadata files and gRPC).
	for _, d := range []string{gpuDriver, nicDriver} {
		sum, _ := framework.AgentMetric(metricsAddress, `hwdra_claim_operation_duration_seconds_sum{driver="`+d+`",operation="prepare",result="success"}`)
		count, _ := framework.AgentMetric(metricsAddress, `hwdra_claim_operation_duration_seconds_count{driver="`+d+`",operation="prepare",result="success"}`)
		var s, c float64
		if _, err := fmt.Sscan(sum, &s); err == nil {
			if _, err := fmt.Sscan(count, &c); err == nil && c > 0 {
				framework.Timing(t, "prepare/agent-side-mean/"+d, time.Duration(s/c*float64(time.Second)))
			}
		}
	}
	throttled, err := framework.AgentMetric(metricsAddress, `hwdra_api_client_throttled_requests_total{client="claims"}`)
	if err != nil {
		t.Fatal(err)
	}
	if throttled != "0" {
		t.Errorf("claim GETs that waited for the client's rate limiter: %q, want 0", throttled)
	}
}

// TestMIGPodRunsWhileItsGPUChurns: a pod's 1g.10gb partition keeps running
// while another 1g.10gb claim on the same GPU is prepared and unprepared
// again and again (its instance created and destroyed each time): the
// pod's instance, CDI spec and claim stay, and the pool is never
// rewritten.
func TestMIGPodRunsWhileItsGPUChurns(t *testing.T) {
	s := startScenario(t, "mig-churn", "mock:dgx-h100", gpuDriver)
	created := s.createPod("steady", s.template(exampleClaim(t, "mig-1g.10gb.yaml")), "/dev")
	s.waitRunning("steady", "mig-churn/steady", created)
	claim, _, err := s.n.WaitPodClaimAllocated(s.ctx, s.ns, "steady", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	held := claim.Status.Allocation.Devices.Results[0].Device
	slicesNow, err := s.n.WaitPoolsComplete(s.ctx, gpuDriver, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var gpu string
	var start int64
	for _, sl := range slicesNow {
		for _, d := range sl.Spec.Devices {
			if d.Name == held {
				gpu = *d.Attributes["resource.kubernetes.io/pciBusID"].StringValue
				start = *d.Attributes["gpu.hwdra.io/placementStart"].IntValue
			}
		}
	}
	if gpu == "" {
		t.Fatalf("device %s of the pod's claim is not in the published slices", held)
	}
	writes, err := s.n.WatchSliceWrites(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	alloc, err := s.n.Allocator(s.ctx, gpuDriver)
	if err != nil {
		t.Fatal(err)
	}
	dra := s.n.DRAClient(t, gpuDriver)
	other := oneDevice("", "mig.gpu.hwdra.io", fmt.Sprintf(
		`device.attributes["gpu.hwdra.io"].profile == "1g.10gb" && device.attributes["resource.kubernetes.io"].pciBusID == %q && device.attributes["gpu.hwdra.io"].placementStart != %d`,
		gpu, start))
	specs := cdiSpecsMentioning(t, s.n.CDIDir, string(claim.UID))
	if len(specs) == 0 {
		t.Fatalf("no CDI spec of the pod's claim %s", claim.UID)
	}
	for i := range 10 {
		c := other.DeepCopy()
		c.Name = fmt.Sprintf("churn-%d", i)
		stored, err := s.n.CreateAllocatedClaim(s.ctx, alloc, s.ns, c)
		if err != nil {
			t.Fatal(err)
		}
		prepareUnprepare(s.ctx, t, dra, stored, func() {
			if !slices.Equal(cdiSpecsMentioning(t, s.n.CDIDir, string(claim.UID)), specs) {
				t.Errorf("round %d: the pod's CDI spec changed while another claim was prepared", i)
			}
		})
		alloc.Release(stored)
		if err := s.n.Admin.ResourceV1().ResourceClaims(s.ns).Delete(s.ctx, c.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if pod, err := s.n.Admin.CoreV1().Pods(s.ns).Get(s.ctx, "steady", metav1.GetOptions{}); err != nil || pod.Status.Phase != "Running" ||
		pod.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the pod did not keep running: %v %v", err, pod.Status)
	}
	if got := writes.Count(gpuDriver); got != 0 {
		t.Errorf("%d ResourceSlice writes while claims churned on the pod's GPU: %v", got, writes.Events())
	}
}

// TestPrepareLatencyBesideExampleDriver compares a whole-GPU prepare through
// hwdra with the same call to kubernetes-sigs/dra-example-driver's kubelet
// plugin (8 example GPUs), both on this node's API server and kubelet
// directories, alternating claim by claim so both see the same load. It
// needs that plugin's binary: build cmd/dra-example-kubeletplugin of
// github.com/kubernetes-sigs/dra-example-driver (not on the Go module
// proxy) and set HWDRA_E2E_EXAMPLE_DRIVER to it; skipped otherwise.
func TestPrepareLatencyBesideExampleDriver(t *testing.T) {
	bin := os.Getenv("HWDRA_E2E_EXAMPLE_DRIVER")
	if bin == "" {
		t.Skip("HWDRA_E2E_EXAMPLE_DRIVER is not set: no dra-example-driver kubelet plugin to compare with")
	}
	const exampleDriver = "gpu.example.com"
	n := framework.Shared(t)
	ctx := context.Background()
	n.StartAgent(t, "mock:dgx-h100")
	n.StartProcess(t, "dra-example-kubeletplugin", bin,
		"--node-name="+n.Name, "--kubeconfig="+n.AdminKubeconfig(), "--cdi-root="+n.CDIDir, "--num-devices=8",
		"--kubelet-registrar-directory-path="+n.RegistrarDir(), "--kubelet-plugins-directory-path="+n.PluginsDir())
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: exampleDriver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + exampleDriver + `"`},
		}}},
	}
	if _, err := n.Admin.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Admin.ResourceV1().DeviceClasses().Delete(context.Background(), exampleDriver, metav1.DeleteOptions{})
	})
	alloc, err := n.Allocator(ctx, gpuDriver, exampleDriver)
	if err != nil {
		t.Fatal(err)
	}
	alloc.AddClasses(class)
	ns := n.CreateNamespace(t, "latency")
	ours, theirs := n.DRAClient(t, gpuDriver), n.DRAClient(t, exampleDriver)
	gpu, example := oneDevice("", "gpu.hwdra.io", ""), oneDevice("", exampleDriver, "")
	const rounds = 40
	var hp, hu, ep, eu []time.Duration
	for i := range rounds {
		p, u := claimCycle(ctx, t, n, alloc, ns, ours, gpu, fmt.Sprintf("hwdra-%d", i))
		hp, hu = append(hp, p), append(hu, u)
		p, u = claimCycle(ctx, t, n, alloc, ns, theirs, example, fmt.Sprintf("example-%d", i))
		ep, eu = append(ep, p), append(eu, u)
	}
	logPercentiles(t, "hwdra-full-gpu", hp, hu)
	logPercentiles(t, "dra-example-driver", ep, eu)
	t.Logf("full-GPU prepare p50: hwdra/dra-example-driver = %.2f", float64(percentile(hp, 0.5))/float64(percentile(ep, 0.5)))
}
