package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestCompatibilityGroupsGateOff: on a node whose apiserver and scheduler run
// with DRADeviceCompatibilityGroups off, the apiserver silently drops every
// compatibilityGroups field of the slices `hwdra slices` prints and keeps the
// rest. This is the condition the agent must detect (DroppedFieldsError);
// the agent then falls back so that the node's GPUs stay allocatable.
//
// The file sorts last so that the shared node is started only once before it.
func TestCompatibilityGroupsGateOff(t *testing.T) {
	n := framework.New(t, framework.Options{FeatureGates: map[string]bool{"DRADeviceCompatibilityGroups": false}})
	framework.RecordTiming(t, "node start (DRADeviceCompatibilityGroups off)", n.StartupTime)
	ctx := context.Background()
	objs := hwdraSlices(t, "mock:dgx-h100", n.Name)
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
	// cluster understands: its GPUs stay allocatable and a pod runs.
	agent := n.StartAgent(t, "mock:dgx-h100")
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
	claim, err := framework.ExampleClaim("gpu-full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := framework.TemplateFor(claim)
	if _, err := n.Admin.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := framework.PodWithClaimTemplate("gpu", tmpl.Name)
	began := time.Now()
	if _, err := n.Admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.WaitPodRunning(ctx, ns, pod.Name, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	framework.RecordTiming(t, "full GPU pod creation -> Running (compatibility groups off)", time.Since(began))
}
