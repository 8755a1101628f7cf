// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	resourcealpha "k8s.io/api/resource/v1alpha3"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestCompatibilityGroupsGateOff: on a node whose apiserver and scheduler run
// with DRADeviceCompatibilityGroups off, the apiserver keeps every field of
// a DGX H100's slices (only GPUs that offer vGPUs carry compatibility
// groups), and on a vGPU host it silently drops every compatibilityGroups
// field and keeps the rest. This is the condition the agent must detect
// (DroppedFieldsError); the agent then falls back so that the node's GPUs
// stay allocatable.
//
// The file sorts last so that the shared node is started only once before it.
func TestCompatibilityGroupsGateOff(t *testing.T) {
	n := framework.New(t, framework.Options{FeatureGates: map[string]bool{"DRADeviceCompatibilityGroups": false}})
	framework.RecordTiming(t, "node start (DRADeviceCompatibilityGroups off)", n.StartupTime)
	ctx := context.Background()
	publishSlices(t, n, hwdraSlices(t, "mock:dgx-h100", n.Name), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})

	objs := hwdraSlices(t, "mock:h100-vgpu", n.Name)
	creds, err := n.AgentCredentials(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(creds.Config)
	if err != nil {
		t.Fatal(err)
	}
	var dropped int
	for _, obj := range objs {
		got, err := dc.Resource(sliceGVR).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s: %v", obj.GetName(), err)
		}
		for _, d := range framework.Missing(obj.Object["spec"], got.Object["spec"]) {
			if !strings.Contains(d, "compatibilityGroups: dropped") {
				t.Errorf("%s: unexpected difference %s", obj.GetName(), d)
			}
			dropped++
		}
	}
	if dropped == 0 {
		t.Error("no compatibilityGroups field was dropped: is the gate really off, or do the slices have none?")
	}
	t.Logf("%d compatibilityGroups fields dropped by the apiserver", dropped)
	for _, obj := range objs {
		_ = n.Admin.ResourceV1().ResourceSlices().Delete(ctx, obj.GetName(), metav1.DeleteOptions{})
	}

	// The agent on this node detects the drop and falls back to slices the
	// cluster understands (no vGPUs): its MIG partitions stay allocatable
	// and a pod runs.
	agent := n.StartAgent(t, "mock:h100-vgpu")
	if _, err := n.WaitResourceSlices(ctx, "gpu.hwdra.io", 60*time.Second); err != nil {
		t.Fatal(err)
	}
	// It says which gate is missing.
	waitfor.True(t, "the agent naming the missing gate DRADeviceCompatibilityGroups in its log", 20*time.Second, func() bool {
		return strings.Contains(agent.Tail(200), "DRADeviceCompatibilityGroups")
	})
	ns := n.CreateNamespace(t, "gate-off")
	t.Cleanup(func() {
		if err := n.DeletePodsAndClaims(context.Background(), ns, 90*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	framework.RecordTiming(t, "1g.10gb pod creation -> Running on a vGPU host (compatibility groups off)", examplePodRunning(t, n, ns, "mig-1g.10gb.yaml", "mig"))
}

// TestGateTurnedOffAfterSlicesStored: the agent publishes the full model
// (compatibility groups on the MIG devices of a vGPU host: only GPUs that
// offer vGPUs carry groups) while DRADeviceCompatibilityGroups is on; then
// the control plane restarts with the gate off. The API server keeps the
// stored groups (an update keeps a gated field the old object
// has), so no write reports a dropped field, and the scheduler, without
// the gate, ignores every slice with groups: the node's GPU pool is
// incomplete and a MIG pod stays pending. The agent's feature check (a
// dry-run create) finds the gate off: at start (the agent restarted), the
// first publication is without groups and the pod runs; the agent says so
// in its log, /readyz and hwdra_feature_disabled. Every few seconds after
// (--feature-check-interval), it finds the gate back on (groups return)
// and off again (groups go, a second pod runs).
func TestGateTurnedOffAfterSlicesStored(t *testing.T) {
	n := framework.New(t, framework.Options{})
	ctx := context.Background()
	// Each step's time (the test takes minutes: where they go).
	step := time.Now()
	timing := func(name string) {
		framework.Timing(t, "gate-later/"+name, time.Since(step))
		step = time.Now()
	}
	agent := n.StartAgent(t, "mock:h100-vgpu", "--feature-check-interval=1h")
	if got := waitGPUPool(t, n, true); got == 0 {
		t.Fatal("the full model has no device with compatibility groups: the test shows nothing")
	}
	readyz(t, "", 60*time.Second)
	timing("published-with-groups")

	if err := n.RestartControlPlane(ctx, map[string]bool{"DRADeviceCompatibilityGroups": false}); err != nil {
		t.Fatal(err)
	}
	timing("control-plane-restarted-gate-off")
	ns := n.CreateNamespace(t, "gate-later")
	t.Cleanup(func() {
		if err := n.DeletePodsAndClaims(context.Background(), ns, 90*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	claim, err := framework.ExampleClaim("mig-1g.10gb.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := framework.TemplateFor(claim)
	if _, err := n.Admin.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := framework.PodWithClaimTemplate("mig-1", tmpl.Name)
	if _, err := n.Admin.CoreV1().Pods(ns).Create(ctx, first, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The stored slices keep their groups through the restart, and the
	// scheduler without the gate finds no complete pool: real time passes
	// (15 s, the scheduler's retries) to show the pod stays unscheduled,
	// watched throughout.
	waitfor.Never(t, "the pod scheduled, or the groups dropped", 15*time.Second, func() bool {
		if got := gpuPoolGroups(t, n); got == 0 {
			t.Error("the API server dropped the stored groups on its own: the test shows nothing")
			return true
		}
		if p, err := n.Admin.CoreV1().Pods(ns).Get(ctx, first.Name, metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
			t.Errorf("the MIG pod was scheduled from slices with groups by a scheduler without the gate (%v): the test shows nothing", err)
			return true
		}
		return false
	})
	timing("pod-unscheduled-watched")

	// Restarted, the agent checks before publishing.
	agent.Args[len(agent.Args)-1] = "--feature-check-interval=3s"
	if err := agent.Restart(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	waitGPUPool(t, n, false)
	timing("agent-restarted-to-fallback-published")
	if _, err := n.WaitPodRunning(ctx, ns, first.Name, 90*time.Second); err != nil {
		t.Fatalf("the MIG pod does not run from the fallback model: %v", err)
	}
	timing("fallback-to-pod-running")
	if !strings.Contains(agent.Tail(300), "DRADeviceCompatibilityGroups") {
		t.Errorf("the agent's log never names the gate:\n%s", agent.Tail(40))
	}
	if body := readyz(t, "warning: publishing without DRA features the API server drops (DRADeviceCompatibilityGroups): no vGPU devices", 30*time.Second); !strings.HasPrefix(body, "ok\n") {
		t.Errorf("/readyz: %q", body)
	}
	wantFeatureMetric(t, "1")
	timing("readyz-and-metric")

	// The gate back on: the periodic check returns to the full model.
	if err := n.RestartControlPlane(ctx, map[string]bool{"DRADeviceCompatibilityGroups": true}); err != nil {
		t.Fatal(err)
	}
	waitGPUPool(t, n, true)
	wantFeatureMetric(t, "0")
	timing("gate-on-to-full-model")
	// And off again while the agent runs: the periodic check falls back.
	if err := n.RestartControlPlane(ctx, map[string]bool{"DRADeviceCompatibilityGroups": false}); err != nil {
		t.Fatal(err)
	}
	waitGPUPool(t, n, false)
	wantFeatureMetric(t, "1")
	timing("gate-off-to-fallback")
	second := framework.PodWithClaimTemplate("mig-2", tmpl.Name)
	if _, err := n.Admin.CoreV1().Pods(ns).Create(ctx, second, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.WaitPodRunning(ctx, ns, second.Name, 90*time.Second); err != nil {
		t.Fatalf("a MIG pod after the gate went off under a running agent: %v", err)
	}
	timing("second-pod-running")
}

// gpuPoolGroups counts the devices with compatibility groups in the
// latest complete generation of the node's GPU pool, -1 while it is
// incomplete.
func gpuPoolGroups(t *testing.T, n *framework.Node) int {
	t.Helper()
	list, err := n.Admin.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name + ",spec.driver=" + gpuDriver})
	if err != nil {
		t.Fatal(err)
	}
	gen := int64(-1)
	for _, s := range list.Items {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	slices, groups := 0, 0
	var count int64
	for _, s := range list.Items {
		if s.Spec.Pool.Generation != gen {
			continue
		}
		slices++
		count = s.Spec.Pool.ResourceSliceCount
		for _, d := range s.Spec.Devices {
			for _, c := range d.ConsumesCounters {
				if len(c.CompatibilityGroups) > 0 {
					groups++
				}
			}
		}
	}
	if slices == 0 || int64(slices) != count {
		return -1
	}
	return groups
}

// waitGPUPool waits until the node's GPU pool is complete and has devices
// with compatibility groups (or none), and returns how many.
func waitGPUPool(t *testing.T, n *framework.Node, withGroups bool) int {
	t.Helper()
	var got int
	waitfor.NoError(t, fmt.Sprintf("the GPU pool complete, with compatibility groups: %v", withGroups), 60*time.Second, func() error {
		if got = gpuPoolGroups(t, n); got >= 0 && (got > 0) == withGroups {
			return nil
		}
		return fmt.Errorf("%d devices with compatibility groups (-1: incomplete)", got)
	})
	return got
}

// readyz waits until the agent process's /readyz answers 200 with a body
// containing want, and returns the body.
func readyz(t *testing.T, want string, timeout time.Duration) string {
	t.Helper()
	var body string
	waitfor.NoError(t, fmt.Sprintf("/readyz 200 with %q", want), timeout, func() error {
		resp, err := http.Get("http://" + framework.AgentAddr + "/readyz")
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if body = string(b); resp.StatusCode != http.StatusOK || !strings.Contains(body, want) {
			return fmt.Errorf("%d %q", resp.StatusCode, b)
		}
		return nil
	})
	return body
}

// wantFeatureMetric waits until hwdra_feature_disabled of
// DRADeviceCompatibilityGroups is want.
func wantFeatureMetric(t *testing.T, want string) {
	t.Helper()
	waitfor.NoError(t, `hwdra_feature_disabled{feature="DRADeviceCompatibilityGroups"} = `+want, 20*time.Second, func() error {
		got, err := framework.AgentMetric(framework.AgentAddr, `hwdra_feature_disabled{feature="DRADeviceCompatibilityGroups"}`)
		if err == nil && got != want {
			err = fmt.Errorf("%q", got)
		}
		return err
	})
}

// examplePodRunning runs a pod with a claim from deploy/examples/<file>
// in ns and returns how long it took from creation to Running.
func examplePodRunning(t *testing.T, n *framework.Node, ns, file, name string) time.Duration {
	t.Helper()
	ctx := context.Background()
	claim, err := framework.ExampleClaim(file)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := framework.TemplateFor(claim)
	if _, err := n.Admin.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := framework.PodWithClaimTemplate(name, tmpl.Name)
	began := time.Now()
	if _, err := n.Admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.WaitPodRunning(ctx, ns, pod.Name, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	return time.Since(began)
}

// TestPartitionTypeGateOff: with DRAPartitionableDevicesType off in every
// component, the apiserver keeps every field of the slices `hwdra slices`
// prints (no slice declares a partition type, the one field that gate
// guards), so the agent has nothing to fall back from: it publishes its
// full model and says nothing of a missing gate. The pools stay valid: a
// pod gets a 1g.10gb partition through the real scheduler, and the
// pool-status controller (DRAResourcePoolStatus still on) answers both
// drivers' pools with no validationError and the counts `hwdra
// pool-status` reports.
func TestPartitionTypeGateOff(t *testing.T) {
	n := framework.New(t, framework.Options{FeatureGates: map[string]bool{"DRAPartitionableDevicesType": false}})
	framework.RecordTiming(t, "node start (DRAPartitionableDevicesType off)", n.StartupTime)
	ctx := context.Background()
	publishSlices(t, n, hwdraSlices(t, "mock:dgx-h100", n.Name), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})

	agent := n.StartAgent(t, "mock:dgx-h100")
	for _, d := range []string{gpuDriver, nicDriver} {
		if _, err := n.WaitPoolsComplete(ctx, d, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	ns := n.CreateNamespace(t, "gate-off")
	t.Cleanup(func() {
		if err := n.DeletePodsAndClaims(context.Background(), ns, 90*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	framework.RecordTiming(t, "1g.10gb pod creation -> Running (partition type gate off)", examplePodRunning(t, n, ns, "mig-1g.10gb.yaml", "mig"))
	if strings.Contains(agent.Tail(500), "dropped fields") {
		t.Errorf("the agent fell back from a dropped field:\n%s", agent.Tail(50))
	}

	var controller []resourcealpha.PoolStatus
	for _, d := range []string{gpuDriver, nicDriver} {
		controller = append(controller, requestPoolStatus(t, n, d, n.Name)...)
	}
	ours := hwdraPoolStatus(t, n, n.Name)
	if len(controller) != 2 || len(ours.Pools) != 2 {
		t.Fatalf("pools: controller %d, hwdra pool-status %d; want 2", len(controller), len(ours.Pools))
	}
	minor, err := framework.KubeMinor()
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range controller {
		if p.ValidationError != nil {
			t.Errorf("controller: pool %s/%s: validationError %q", p.Driver, p.PoolName, *p.ValidationError)
		}
		mine := ours.Pools[i].PoolStatus
		if minor < 37 {
			// Kubernetes 1.36's controller has no summary of shareable
			// capacity (1.37 added it); hwdra pool-status has it on both.
			mine.ShareableSummary = nil
		}
		if !equality.Semantic.DeepEqual(mine, p) {
			t.Errorf("pool %s/%s: hwdra pool-status %+v, controller %+v", p.Driver, p.PoolName, mine, p)
		}
	}
	if got := controller[0].AllocatedDevices; got == nil || *got != 1 {
		t.Errorf("controller: %v GPU devices allocated, want the pod's 1", got)
	}
}

// TestGateOffPartitionableDevices: with DRAPartitionableDevices off in the
// API server and the scheduler, the agent takes the fallback it names in
// its log and /readyz (whole GPUs only: no counter sets, no MIG partitions
// to make, no GPU shares), publishes slices the API server stores as
// published (/readyz is ok only once the stored slices equal the
// publication), with no field of the gate in them, and a pod gets a
// whole GPU. VF shares need no counters: a pod gets one.
func TestGateOffPartitionableDevices(t *testing.T) {
	// The gates that need it go off with it (else the components refuse
	// to start); the agent names this one, whose loss covers theirs.
	g := startGateOff(t, []string{"DRAPartitionableDevices", "DRAPartitionableDevicesType", "DRADeviceCompatibilityGroups"},
		map[string]string{"DRAPartitionableDevices": "no MIG partitions to create and no GPU shares: whole GPUs and existing MIG instances only"})
	for _, s := range g.slices(gpuDriver) {
		if len(s.Spec.SharedCounters) > 0 {
			t.Errorf("slice %s has counter sets with DRAPartitionableDevices off", s.Name)
		}
		for _, d := range s.Spec.Devices {
			if len(d.ConsumesCounters) > 0 || sliceAttr(&d, "gpu.hwdra.io/type") != "gpu" {
				t.Errorf("device %s (type %s) with DRAPartitionableDevices off: counters %v", d.Name, sliceAttr(&d, "gpu.hwdra.io/type"), d.ConsumesCounters)
			}
		}
	}
	framework.RecordTiming(t, "whole GPU pod creation -> Running (DRAPartitionableDevices off)", examplePodRunning(t, g.n, g.ns, "gpu-full.yaml", "gpu"))
	framework.RecordTiming(t, "VF share pod creation -> Running (DRAPartitionableDevices off)", examplePodRunning(t, g.n, g.ns, "vf-share-10g.yaml", "vf"))
}

// TestGateOffConsumableCapacity: with DRAConsumableCapacity off in the API
// server and the scheduler, the chart installs (its VF classes select by
// the published mode: the API server's CEL has no allowMultipleAllocations
// without the gate), the agent takes the fallback it names in its
// log and /readyz (no shares: each PF's VFs offered one device each, no
// GPU share devices), publishes slices the API server stores as published,
// with no field of the gate in them, and a pod gets a whole GPU and
// another an exclusive VF.
func TestGateOffConsumableCapacity(t *testing.T) {
	// DRAFractionalCapacityRange (beta, on in 1.37) needs it: off with it.
	g := startGateOff(t, []string{"DRAConsumableCapacity", "DRAFractionalCapacityRange"},
		map[string]string{"DRAConsumableCapacity": "no GPU shares and no bandwidth shares of a PF"})
	vfs := 0
	for _, driver := range []string{gpuDriver, nicDriver} {
		for _, s := range g.slices(driver) {
			for _, d := range s.Spec.Devices {
				if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
					t.Errorf("device %s is shareable with DRAConsumableCapacity off", d.Name)
				}
				for name, c := range d.Capacity {
					if c.RequestPolicy != nil {
						t.Errorf("device %s: capacity %s has a request policy with DRAConsumableCapacity off", d.Name, name)
					}
				}
				if driver == nicDriver {
					vfs++
				}
			}
		}
	}
	if vfs == 0 {
		t.Fatal("no exclusive VF published")
	}
	framework.RecordTiming(t, "whole GPU pod creation -> Running (DRAConsumableCapacity off)", examplePodRunning(t, g.n, g.ns, "gpu-full.yaml", "gpu"))
	vf := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "vf"}, Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: "vf.sriov.hwdra.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}}}}
	framework.RecordTiming(t, "exclusive VF pod creation -> Running (DRAConsumableCapacity off)", claimPodRunning(t, g.n, g.ns, vf, "vf"))
}

// gateOff is a dedicated node with one DRA gate off and the agent on a
// mock DGX H100 that fell back from it.
type gateOff struct {
	t  *testing.T
	n  *framework.Node
	ns string
}

// startGateOff starts a node with the gates off in every component and
// the agent on a mock DGX H100, and checks that the agent says which
// fallback it took: in its log and /readyz (ok: the stored slices are the
// publication; each gate the agent checks, named, with what the model
// loses without it) and hwdra_feature_disabled.
func startGateOff(t *testing.T, off []string, named map[string]string) *gateOff {
	t.Helper()
	gates := map[string]bool{}
	for _, g := range off {
		gates[g] = false
	}
	n := framework.New(t, framework.Options{FeatureGates: gates})
	framework.RecordTiming(t, "node start ("+strings.Join(off, ", ")+" off)", n.StartupTime)
	ctx := context.Background()
	agent := n.StartAgent(t, "mock:dgx-h100")
	for _, d := range []string{gpuDriver, nicDriver} {
		if _, err := n.WaitPoolsComplete(ctx, d, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := agent.WaitLog(ctx, 0, framework.NRISynced, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	body := readyz(t, "publishing without DRA features the API server drops (", 60*time.Second)
	t.Logf("/readyz: %q", body)
	if !strings.HasPrefix(body, "ok\n") {
		t.Errorf("/readyz: %q, want ok: the stored slices are the publication", body)
	}
	for gate, lost := range named {
		if err := agent.WaitLog(ctx, 0, gate, 20*time.Second); err != nil {
			t.Errorf("the agent's log never names %s: %v\n%s", gate, err, agent.Tail(40))
		}
		if !strings.Contains(body, gate) || !strings.Contains(body, lost) {
			t.Errorf("/readyz does not name %s and what it costs (%q)", gate, lost)
		}
		if got, err := framework.AgentMetric(framework.AgentAddr, `hwdra_feature_disabled{feature="`+gate+`"}`); err != nil || got != "1" {
			t.Errorf("hwdra_feature_disabled{feature=%q} = %q (%v), want 1", gate, got, err)
		}
	}
	ns := n.CreateNamespace(t, "gate-off")
	t.Cleanup(func() {
		if err := n.DeletePodsAndClaims(context.Background(), ns, 90*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return &gateOff{t: t, n: n, ns: ns}
}

// slices are the driver's slices of the node as the API server stores
// them.
func (g *gateOff) slices(driver string) []resourceapi.ResourceSlice {
	g.t.Helper()
	list, err := g.n.Admin.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + g.n.Name + ",spec.driver=" + driver})
	if err != nil {
		g.t.Fatal(err)
	}
	if len(list.Items) == 0 {
		g.t.Fatalf("no slices of %s", driver)
	}
	return list.Items
}

// claimPodRunning runs a pod with a claim from a template made of claim
// in ns and returns how long it took from creation to Running.
func claimPodRunning(t *testing.T, n *framework.Node, ns string, claim *resourceapi.ResourceClaim, name string) time.Duration {
	t.Helper()
	ctx := context.Background()
	tmpl := framework.TemplateFor(claim)
	if _, err := n.Admin.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := framework.PodWithClaimTemplate(name, tmpl.Name)
	began := time.Now()
	if _, err := n.Admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.WaitPodRunning(ctx, ns, pod.Name, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	return time.Since(began)
}
