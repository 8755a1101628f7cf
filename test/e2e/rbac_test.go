package e2e

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// slice is a minimal ResourceSlice of driver on node (nodeName "" means
// allNodes).
func slice(name, driver, node string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:  driver,
			Pool:    resourceapi.ResourcePool{Name: "pool", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "dev-0"}},
		},
	}
	if node == "" {
		s.Spec.AllNodes = ptr.To(true)
	} else {
		s.Spec.NodeName = &node
	}
	return s
}

// TestAgentSliceWritesPinnedToItsNode: with the agent's own credentials (the
// chart's ServiceAccount, token bound to its node) it may publish slices
// of its drivers on its node, and nothing else: the ValidatingAdmissionPolicy
// refuses other nodes, other drivers, node-less slices and tokens without a
// node.
func TestAgentSliceWritesPinnedToItsNode(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	agent, err := n.AgentCredentials(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	other := fakeNode(t, n, "other-node")
	otherAgent, err := n.AgentCredentials(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	unbound := unboundAgentClient(t, n)

	// A slice of another node, made by the admin, that the agent must not
	// change or delete.
	foreign := slice("e2e-foreign", "gpu.hwdra.io", other)
	if _, err := n.Admin.ResourceV1().ResourceSlices().Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Admin.ResourceV1().ResourceSlices().Delete(ctx, foreign.Name, metav1.DeleteOptions{}) })

	for _, tc := range []struct {
		name    string
		client  kubernetes.Interface
		slice   *resourceapi.ResourceSlice
		allowed bool
		reason  string // part of the denial message
	}{
		{"own node, gpu driver", agent.Client, slice("e2e-own-gpu", "gpu.hwdra.io", n.Name), true, ""},
		{"own node, nic driver", agent.Client, slice("e2e-own-nic", "sriov.hwdra.io", n.Name), true, ""},
		{"other node", agent.Client, slice("e2e-other", "gpu.hwdra.io", other), false, "may not write ResourceSlices of node 'other-node'"},
		{"other driver", agent.Client, slice("e2e-driver", "gpu.example.com", n.Name), false, "driver 'gpu.example.com'"},
		{"all nodes", agent.Client, slice("e2e-all", "gpu.hwdra.io", ""), false, "no node"},
		{"token of other node", otherAgent.Client, slice("e2e-cross", "gpu.hwdra.io", n.Name), false, "on node 'other-node'"},
		{"token without node", unbound, slice("e2e-unbound", "gpu.hwdra.io", n.Name), false, "carry no node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			created, err := tc.client.ResourceV1().ResourceSlices().Create(ctx, tc.slice, metav1.CreateOptions{})
			if !tc.allowed {
				if err == nil {
					_ = n.Admin.ResourceV1().ResourceSlices().Delete(ctx, tc.slice.Name, metav1.DeleteOptions{})
					t.Fatal("create allowed, want denied")
				}
				if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.reason) {
					t.Fatalf("create: %v; want a denial mentioning %q", err, tc.reason)
				}
				return
			}
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			// The agent also updates and deletes its own slices.
			created.Spec.Devices = append(created.Spec.Devices, resourceapi.Device{Name: "dev-1"})
			if _, err := tc.client.ResourceV1().ResourceSlices().Update(ctx, created, metav1.UpdateOptions{}); err != nil {
				t.Errorf("update own slice: %v", err)
			}
			if err := tc.client.ResourceV1().ResourceSlices().Delete(ctx, created.Name, metav1.DeleteOptions{}); err != nil {
				t.Errorf("delete own slice: %v", err)
			}
		})
	}

	t.Run("update and delete another node's slice", func(t *testing.T) {
		s, err := agent.Client.ResourceV1().ResourceSlices().Get(ctx, foreign.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the agent may read slices: %v", err)
		}
		s.Spec.Devices = nil
		if _, err := agent.Client.ResourceV1().ResourceSlices().Update(ctx, s, metav1.UpdateOptions{}); err == nil {
			t.Error("update of another node's slice allowed")
		}
		if err := agent.Client.ResourceV1().ResourceSlices().Delete(ctx, foreign.Name, metav1.DeleteOptions{}); err == nil {
			t.Error("delete of another node's slice allowed")
		}
	})
}

// fakeNode registers a Node object without a kubelet (tainted so nothing is
// scheduled there) and removes it when t ends.
func fakeNode(t *testing.T, n *framework.Node, name string) string {
	t.Helper()
	ctx := context.Background()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{
			Key: "hwdra.io/e2e-fake", Effect: corev1.TaintEffectNoSchedule,
		}}},
	}
	if _, err := n.Admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Admin.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}) })
	return name
}

// unboundAgentClient has the agent's ServiceAccount but a token bound to no
// object: no node in its user info.
func unboundAgentClient(t *testing.T, n *framework.Node) kubernetes.Interface {
	t.Helper()
	creds, err := n.UnboundAgentCredentials(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return creds.Client
}
