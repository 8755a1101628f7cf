// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// slice is a minimal ResourceSlice of driver on node (nodeName "" means
// allNodes), in the node's pool as the agent names it.
func slice(name, driver, node string) *resourceapi.ResourceSlice {
	pool := node
	if pool == "" {
		pool = "pool"
	}
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:  driver,
			Pool:    resourceapi.ResourcePool{Name: pool, ResourceSliceCount: 1},
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
		list, err := agent.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + foreign.Name})
		if err != nil || len(list.Items) != 1 {
			t.Fatalf("the agent may list slices: %v (%d)", err, len(list.Items))
		}
		s := &list.Items[0]
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

// TestTenantNodeCannotPublishUnderAnotherNodesPool: a compromised node
// (the agent's credentials, bound to it) publishes devices under another
// node's pool name on its own node: the API server's admission policy
// refuses the create and an update that moves its own slice there, naming
// the pool. It may still publish its own pool, and clear any slice of its
// node, whatever its pool (a leftover another writer made).
func TestTenantNodeCannotPublishUnderAnotherNodesPool(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	agent, err := n.AgentCredentials(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	victim := fakeNode(t, n, "victim-node")
	slices := agent.Client.ResourceV1().ResourceSlices()
	wantPoolDenied := func(t *testing.T, err error) {
		t.Helper()
		want := "may only write ResourceSlices of its node's pool '" + n.Name + "', not of pool '" + victim + "'"
		if err == nil || !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%v; want the admission policy's denial %q", err, want)
		}
	}

	forged := slice("e2e-forged-pool", "gpu.hwdra.io", n.Name)
	forged.Spec.Pool.Name = victim
	_, err = slices.Create(ctx, forged, metav1.CreateOptions{})
	if err == nil {
		_ = n.Admin.ResourceV1().ResourceSlices().Delete(ctx, forged.Name, metav1.DeleteOptions{})
	}
	wantPoolDenied(t, err)

	own, err := slices.Create(ctx, slice("e2e-own-pool", "gpu.hwdra.io", n.Name), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("its own pool: %v", err)
	}
	t.Cleanup(func() { _ = n.Admin.ResourceV1().ResourceSlices().Delete(ctx, own.Name, metav1.DeleteOptions{}) })
	// Moving its own slice to the other pool: the API server holds the
	// pool name immutable (1.37), the policy refuses it too.
	own.Spec.Pool.Name = victim
	if _, err := slices.Update(ctx, own, metav1.UpdateOptions{}); err == nil || !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
		t.Fatalf("moving its slice to pool %s: %v, want refused", victim, err)
	}
	if err := slices.Delete(ctx, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete its own slice: %v", err)
	}

	leftover := slice("e2e-leftover-pool", "gpu.hwdra.io", n.Name)
	leftover.Spec.Pool.Name = "leftover"
	if _, err := n.Admin.ResourceV1().ResourceSlices().Create(ctx, leftover, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := slices.Delete(ctx, leftover.Name, metav1.DeleteOptions{}); err != nil {
		_ = n.Admin.ResourceV1().ResourceSlices().Delete(ctx, leftover.Name, metav1.DeleteOptions{})
		t.Errorf("delete a slice of its node in another pool: %v", err)
	}
}

// TestTenantAgentCredentialsNarrowed: what the agent's credentials no
// longer allow (docs/security.md): verbs on slices and claims it does not
// use, the core Events API, Events on another node or on objects other
// than pods and its node, and a change of a claim's reservations on its
// own node (granular status authorization). What it uses still works.
func TestTenantAgentCredentialsNarrowed(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	agent, err := n.AgentCredentials(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	c := agent.Client
	victim := fakeNode(t, n, "victim-node-events")
	ns := n.CreateNamespace(t, "narrowed")
	allocatedClaim(t, n, ns, "here", n.Name)
	// A namespaced object's Events go in its namespace, a Node's in
	// "default" (as the agent's recorder puts them).
	event := func(name string, regarding corev1.ObjectReference) *eventsv1.Event {
		in := regarding.Namespace
		if in == "" {
			in = metav1.NamespaceDefault
		}
		return &eventsv1.Event{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-" + ns, Namespace: in}, EventTime: metav1.NowMicro(),
			ReportingController: "hwdra-agent", ReportingInstance: n.Name, Action: "Check", Reason: "E2E",
			Regarding: regarding, Type: corev1.EventTypeWarning, Note: "e2e",
		}
	}
	nodeRef := func(name string) corev1.ObjectReference {
		return corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: name, UID: types.UID(name)}
	}
	for _, tc := range []struct {
		name   string
		do     func() error
		reason string // "" allowed
	}{
		{"patch a slice", func() error {
			_, err := c.ResourceV1().ResourceSlices().Patch(ctx, "any", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{})
			return err
		}, "forbidden"},
		{"delete every slice", func() error {
			return c.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		}, "forbidden"},
		{"watch claims", func() error {
			w, err := c.ResourceV1().ResourceClaims("").Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		}, "forbidden"},
		{"get a pod by name", func() error {
			_, err := c.CoreV1().Pods(ns).Get(ctx, "any", metav1.GetOptions{})
			return err
		}, "forbidden"},
		{"core Events", func() error {
			_, err := c.CoreV1().Events(ns).Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "core"}, InvolvedObject: nodeRef(n.Name)}, metav1.CreateOptions{})
			return err
		}, "forbidden"},
		{"an Event on another node", func() error {
			_, err := c.EventsV1().Events(metav1.NamespaceDefault).Create(ctx, event("other-node", nodeRef(victim)), metav1.CreateOptions{})
			return err
		}, "may not post Events on node '" + victim + "'"},
		{"an Event on a claim", func() error {
			_, err := c.EventsV1().Events(ns).Create(ctx, event("claim", corev1.ObjectReference{Kind: "ResourceClaim", APIVersion: "resource.k8s.io/v1", Namespace: ns, Name: "here"}), metav1.CreateOptions{})
			return err
		}, "only on pods and its node, not on a ResourceClaim"},
		{"a claim's reservations", func() error {
			claim, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, "here", metav1.GetOptions{})
			if err != nil {
				return err
			}
			claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "p", UID: "p"})
			_, err = c.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
			return err
		}, "resourceclaims/binding"},
		{"an Event on its node", func() error {
			_, err := c.EventsV1().Events(metav1.NamespaceDefault).Create(ctx, event("own-node", nodeRef(n.Name)), metav1.CreateOptions{})
			return err
		}, ""},
		{"an Event on a pod", func() error {
			_, err := c.EventsV1().Events(ns).Create(ctx, event("pod", corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: "p"}), metav1.CreateOptions{})
			return err
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.reason == "":
			case err == nil:
				t.Fatal("allowed, want refused")
			case !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.reason):
				t.Fatalf("%v; want a refusal mentioning %q", err, tc.reason)
			}
		})
	}
}
