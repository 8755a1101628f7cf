package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	resourcealpha "k8s.io/api/resource/v1alpha3"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

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
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(agent.Tail(200), "DRADeviceCompatibilityGroups") {
		if time.Now().After(deadline) {
			t.Fatal("the agent never named the missing gate DRADeviceCompatibilityGroups in its log")
		}
		time.Sleep(200 * time.Millisecond)
	}
	ns := n.CreateNamespace(t, "gate-off")
	t.Cleanup(func() {
		if err := n.DeletePodsAndClaims(context.Background(), ns, 90*time.Second); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	framework.RecordTiming(t, "1g.10gb pod creation -> Running on a vGPU host (compatibility groups off)", examplePodRunning(t, n, ns, "mig-1g.10gb.yaml", "mig"))
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
		controller = append(controller, requestPoolStatus(t, n, d)...)
	}
	ours := hwdraPoolStatus(t, n)
	if len(controller) != 2 || len(ours.Pools) != 2 {
		t.Fatalf("pools: controller %d, hwdra pool-status %d; want 2", len(controller), len(ours.Pools))
	}
	for i, p := range controller {
		if p.ValidationError != nil {
			t.Errorf("controller: pool %s/%s: validationError %q", p.Driver, p.PoolName, *p.ValidationError)
		}
		if !equality.Semantic.DeepEqual(ours.Pools[i].PoolStatus, p) {
			t.Errorf("pool %s/%s: hwdra pool-status %+v, controller %+v", p.Driver, p.PoolName, ours.Pools[i].PoolStatus, p)
		}
	}
	if got := controller[0].AllocatedDevices; got == nil || *got != 1 {
		t.Errorf("controller: %v GPU devices allocated, want the pod's 1", got)
	}
}
