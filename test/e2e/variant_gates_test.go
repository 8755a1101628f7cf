package e2e

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestCompatibilityGroupsGateOff: on a node whose apiserver and scheduler run
// with DRADeviceCompatibilityGroups off, the apiserver silently drops every
// compatibilityGroups field of the slices `hwdra slices` prints and keeps the
// rest. This is the condition the agent must detect (DroppedFieldsError) and
// fall back from; the agent's own test builds on this node variant.
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
}
