// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// The multi-node scenarios where one node fails the cluster in a way its
// agent cannot mend: the API server refuses its slices, or the node
// vanishes while pods are being placed on it. In both the other nodes'
// pods are placed as before.

// refusedMessage is the stand-in policy's message: an operator's policy,
// webhook or quota that refuses a node's ResourceSlices.
const refusedMessage = "e2e: the ResourceSlices of node mig are refused (a stand-in for an operator's policy or quota)"

// refusedSlices: the API server refuses the MIG node's slices while a
// fault changes them (an XID 79 on one GPU: its devices to be tainted).
// The node's agent goes unready and records a Warning Event on its Node
// naming the refusal; the API keeps the node's last slices, untainted
// (the scheduler cannot learn of the fault); the other nodes serve on:
// a pod is placed on them as before. The refusal lifted, the agent writes
// the tainted slices and is ready again.
func (m *multiNode) refusedSlices(t *testing.T) {
	s := m.scenario(t)
	w := m.c.Worker(migNode)
	others := map[string]int{}
	for _, o := range m.c.Workers {
		if o != w {
			others[o.Name] = m.sliceCount(t, o)
		}
	}
	lift := m.refuseSlicesOf(t, migNode)
	bus := gpuBusIDs(t, m.ctx, w)[0]
	hwdraInject(t, w.WorkerMockDir(), "xid", "--gpu", bus, "--code", "79")
	t.Cleanup(func() { hwdraInject(t, w.WorkerMockDir(), "clear", "--gpu", bus) })
	injected := time.Now()

	m.waitAgentReady(t, w, false)
	framework.Timing(t, "multinode-refused-to-agent-unready", time.Since(injected))
	ev := m.waitNodeEvent(t, migNode, "ResourceSlicesRefused", injected)
	if ev.Type != corev1.EventTypeWarning || ev.ReportingController != "hwdra-agent" || !strings.Contains(ev.Note, refusedMessage) {
		t.Errorf("Event on node %s: %s %s from %q: %q; want a Warning from hwdra-agent naming the policy's message", migNode, ev.Type, ev.Reason, ev.ReportingController, ev.Note)
	}
	t.Logf("Event on node %s: %s", migNode, ev.Note)
	// The API still holds the node's slices as they were: complete,
	// untainted.
	m.waitTainted(t, w, 0)

	// The other nodes serve as before.
	r := s.runPod("while-refused", s.template(exampleClaimNamed(t, "vf-share-10g.yaml", "while-refused")), "multinode-pod-while-slices-refused")
	if r.pod.Spec.NodeName != dgxNode && r.pod.Spec.NodeName != nicNode {
		t.Errorf("pod while-refused runs on %s, a node without NICs", r.pod.Spec.NodeName)
	}
	for name, n := range others {
		if got := m.sliceCount(t, m.c.Worker(name)); got != n {
			t.Errorf("node %s publishes %d slices while %s's are refused, %d before", name, got, migNode, n)
		}
	}
	m.waitTainted(t, w, 0) // still refused

	lift()
	lifted := time.Now()
	m.waitTainted(t, w, 1)
	framework.Timing(t, "multinode-refusal-lifted-to-slices-written", time.Since(lifted))
	// Ready at the publisher's next check: it checks an unverified
	// publication with backoff up to the resync period (30 s).
	m.waitAgentReady(t, w, true)
	framework.Timing(t, "multinode-refusal-lifted-to-agent-ready", time.Since(lifted))
	hwdraInject(t, w.WorkerMockDir(), "clear", "--gpu", bus)
	m.waitTainted(t, w, 0)
}

// refuseSlicesOf makes the API server refuse creates and updates of the
// node's ResourceSlices (a ValidatingAdmissionPolicy and its binding),
// once a dry-run create shows it in force; lift removes both.
func (m *multiNode) refuseSlicesOf(t *testing.T, node string) (lift func()) {
	t.Helper()
	name := "e2e-refuse-slices-of-" + node
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
					Rule: admissionv1.Rule{
						APIGroups: []string{resourceapi.GroupName}, APIVersions: []string{"*"}, Resources: []string{"resourceslices"},
					},
				},
			}}},
			Validations: []admissionv1.Validation{{
				Expression: fmt.Sprintf(`!has(object.spec.nodeName) || object.spec.nodeName != %q`, node),
				Message:    refusedMessage,
			}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: name, ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
		},
	}
	api := m.c.Admin.AdmissionregistrationV1()
	if _, err := api.ValidatingAdmissionPolicies().Create(m.ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.ValidatingAdmissionPolicyBindings().Create(m.ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lifted := false
	lift = func() {
		if lifted {
			return
		}
		lifted = true
		ctx := context.Background()
		for _, err := range []error{
			api.ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{}),
			api.ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{}),
		} {
			if err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("lift the refusal: %v", err)
			}
		}
	}
	t.Cleanup(lift)
	probe := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: gpuDriver, NodeName: &node,
			Pool: resourceapi.ResourcePool{Name: "probe", ResourceSliceCount: 1},
		},
	}
	waitfor.NoError(t, fmt.Sprintf("policy %s in force (a dry-run create of a slice of %s refused)", name, node), 30*time.Second, func() error {
		_, err := m.c.Admin.ResourceV1().ResourceSlices().Create(m.ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), refusedMessage) {
			return nil
		}
		return fmt.Errorf("dry-run create: %v", err)
	})
	return lift
}

// waitAgentReady waits until the kubelet reports the worker's agent pod
// ready (or not).
func (m *multiNode) waitAgentReady(t *testing.T, w *framework.Node, ready bool) {
	t.Helper()
	p, err := m.c.AgentPodOn(m.ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.c.WaitPod(m.ctx, p.Namespace, p.Name, 90*time.Second, fmt.Sprintf("ready=%v", ready),
		func(p *corev1.Pod) bool { return framework.PodReady(p) == ready }); err != nil {
		t.Fatal(err)
	}
}

// waitNodeEvent waits for an Event (events.k8s.io) about the node with
// the reason, newer than since, and returns it.
func (m *multiNode) waitNodeEvent(t *testing.T, node, reason string, since time.Time) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	waitfor.NoError(t, fmt.Sprintf("a %s Event on node %s", reason, node), 60*time.Second, func() error {
		list, err := m.c.Admin.EventsV1().Events(metav1.NamespaceDefault).List(m.ctx, metav1.ListOptions{
			FieldSelector: "regarding.kind=Node,regarding.name=" + node + ",reason=" + reason,
		})
		if err != nil {
			return err
		}
		for _, e := range list.Items {
			// The Event's time has microseconds; since has more.
			if !e.EventTime.Time.Before(since.Truncate(time.Second)) {
				found = e
				return nil
			}
		}
		return fmt.Errorf("%d older Events", len(list.Items))
	})
	return found
}

// nodeVanishes: the MIG node vanishes (its kubelet and agent killed, its
// Node deleted, as a cloud's node controller does for a machine that is
// gone) while the scheduler places a Deployment's pods that prefer it.
// Nothing more is placed there; the garbage collector removes its slices
// (owned by the Node); the pods bound to it are deleted by the pod GC
// and run again on the other nodes; other pods are placed meanwhile as
// usual. The node back (its kubelet registers a new Node), its agent
// publishes slices owned by the new Node, and the kubelet unprepares the
// claims of the pods that are gone: no MIG instance is left.
func (m *multiNode) nodeVanishes(t *testing.T) {
	s := m.scenario(t)
	w := m.c.Worker(migNode)
	idle := mockState(t, w).GPUInstanceCount()
	node, err := m.c.Admin.CoreV1().Nodes().Get(m.ctx, migNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const app, replicas = "v-mig", 4
	t.Cleanup(func() { m.deleteDeployment(t, app) })
	m.createDeployment(t, app, s.template(exampleClaimNamed(t, "mig-1g.10gb.yaml", app)), migNode)
	first := m.waitDeploymentPod(t, app, func(p *corev1.Pod) bool { return p.Spec.NodeName == migNode })
	if got := mockState(t, w).GPUInstanceCount(); got != idle+1 {
		t.Fatalf("mig node: %d GPU instances with pod %s, %d before", got, first.name, idle)
	}

	// More replicas, and at once the node vanishes: the scheduler is
	// placing them.
	scale := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := m.c.Admin.AppsV1().Deployments(m.ns).Patch(m.ctx, app, types.MergePatchType, []byte(scale), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	w.Kubelet.Kill()
	if w.KillAgent(t.Logf) == 0 {
		t.Fatal("no agent process found on the vanishing node")
	}
	if err := m.c.Admin.CoreV1().Nodes().Delete(m.ctx, migNode, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	vanished := time.Now()

	r := s.runPod("while-vanished", s.template(exampleClaimNamed(t, "vgpu.yaml", "while-vanished")), "multinode-pod-while-node-vanished")
	onNode(t, r, vgpuNode)
	m.waitNoSlices(t, migNode)
	framework.Timing(t, "multinode-node-vanished-to-slices-gone", time.Since(vanished))
	m.waitReplicasOff(t, app, replicas, migNode)
	framework.Timing(t, "multinode-node-vanished-to-replicas-elsewhere", time.Since(vanished))

	back := time.Now()
	if err := w.Kubelet.Start(); err != nil {
		t.Fatal(err)
	}
	m.waitNodeReady(t, w, corev1.ConditionTrue, 90*time.Second)
	// A new Node: labelled for the DaemonSet again, as the operator's
	// node labelling would.
	if err := m.c.LabelForAgent(m.ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := m.c.WaitAgents(m.ctx, len(m.c.Workers), 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	m.waitPublished(t)
	framework.Timing(t, "multinode-node-back-to-published", time.Since(back))
	again, err := m.c.Admin.CoreV1().Nodes().Get(m.ctx, migNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if again.UID == node.UID {
		t.Fatalf("node %s kept its UID %s: it was not deleted", migNode, node.UID)
	}
	list, err := m.c.Admin.ResourceV1().ResourceSlices().List(m.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + migNode})
	if err != nil {
		t.Fatal(err)
	}
	for _, sl := range list.Items {
		if refs := sl.OwnerReferences; len(refs) != 1 || refs[0].Kind != "Node" || refs[0].UID != again.UID {
			t.Errorf("slice %s owned by %+v, want the new Node %s", sl.Name, refs, again.UID)
		}
	}
	// The kubelet unprepares the claims of its pods that are gone (its
	// DRA manager's reconcile, every 60 s).
	if _, err := framework.WaitMockState(m.ctx, w.WorkerMockDir(), 3*time.Minute, "the vanished pods' MIG instances destroyed", func(st persist.State) bool {
		return st.GPUInstanceCount() == idle
	}); err != nil {
		t.Error(err)
	}
	framework.Timing(t, "multinode-node-back-to-claims-unprepared", time.Since(back))
	// The MIG instances go first; the record, the CDI spec and (after our
	// unprepare returns, in kubeletplugin's NodeUnprepareResources) the
	// device-metadata files follow within the same call: awaited, not
	// read at once (read at once, under load they were still there).
	waitfor.NoError(t, fmt.Sprintf("the vanished pod's claim %s unprepared on %s, its files gone", first.claimName, migNode), 30*time.Second, func() error {
		rec, err := framework.ReadAgentRecords(w.AgentPodStateDir(), gpuDriver)
		if err != nil {
			return err
		}
		if len(rec.Claims) != 0 {
			return fmt.Errorf("claims still prepared: %v", rec.Claims)
		}
		if files := w.ClaimFiles(gpuDriver, m.ns, first.claimName, string(first.claim)); len(files) > 0 {
			return fmt.Errorf("files left: %v", files)
		}
		return nil
	})
}

// waitNoSlices waits until the node has no ResourceSlices.
func (m *multiNode) waitNoSlices(t *testing.T, node string) {
	t.Helper()
	waitfor.NoError(t, "node "+node+" without slices after it vanished", 90*time.Second, func() error {
		list, err := m.c.Admin.ResourceV1().ResourceSlices().List(m.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err == nil && len(list.Items) > 0 {
			err = fmt.Errorf("%d slices", len(list.Items))
		}
		return err
	})
}

// waitReplicasOff waits until the Deployment runs want ready pods, none
// of them on node and no pod left bound to node.
func (m *multiNode) waitReplicasOff(t *testing.T, app string, want int, node string) {
	t.Helper()
	waitfor.NoError(t, fmt.Sprintf("Deployment %s: %d pods ready, none bound to %s", app, want, node), 4*time.Minute, func() error {
		list, err := m.c.Admin.CoreV1().Pods(m.ns).List(m.ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return err
		}
		ready, on, where := 0, 0, map[string]int{}
		for _, p := range list.Items {
			if p.Spec.NodeName == node {
				on++
			}
			if p.DeletionTimestamp == nil && framework.PodReady(&p) {
				ready++
				where[p.Spec.NodeName]++
			}
		}
		if ready != want || on != 0 {
			return fmt.Errorf("%d pods ready, %d still bound to %s", ready, on, node)
		}
		t.Logf("Deployment %s: %d ready pods on %v", app, ready, where)
		return nil
	})
}

// deleteDeployment deletes a Deployment, then its pods and claims.
func (m *multiNode) deleteDeployment(t *testing.T, name string) {
	ctx := context.Background()
	err := m.c.Admin.AppsV1().Deployments(m.ns).Delete(ctx, name,
		metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
	if err == nil || apierrors.IsNotFound(err) {
		err = m.c.DeletePodsAndClaims(ctx, m.ns, 2*time.Minute)
	}
	if err != nil {
		t.Errorf("delete Deployment %s: %v", name, err)
	}
}
