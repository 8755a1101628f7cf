// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/internal/mock/drivertools"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// The multi-node scenarios that change the cluster under running pods
// (multinode_test.go has the cluster and the placement scenarios): a
// rolling update of the agents, a drain, a lost node.

// podState is what a running pod must keep through an agent's update or
// its node's loss: the same container, never restarted, its claim.
type podState struct {
	name, node, container string
	uid, claim            types.UID
	claimName             string
}

// runningPods records every running pod of the namespace.
func (m *multiNode) runningPods(t *testing.T) []podState {
	t.Helper()
	list, err := m.c.Admin.CoreV1().Pods(m.ns).List(m.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []podState
	for _, p := range list.Items {
		if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 || p.DeletionTimestamp != nil {
			continue
		}
		out = append(out, m.stateOf(t, &p))
	}
	return out
}

// stateOf is a pod's podState: its node, container and claim.
func (m *multiNode) stateOf(t *testing.T, p *corev1.Pod) podState {
	t.Helper()
	st := podState{name: p.Name, node: p.Spec.NodeName, uid: p.UID}
	if len(p.Status.ContainerStatuses) == 1 {
		st.container = p.Status.ContainerStatuses[0].ContainerID
	}
	if len(p.Status.ResourceClaimStatuses) == 1 && p.Status.ResourceClaimStatuses[0].ResourceClaimName != nil {
		st.claimName = *p.Status.ResourceClaimStatuses[0].ResourceClaimName
		c, err := m.c.Admin.ResourceV1().ResourceClaims(m.ns).Get(m.ctx, st.claimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		st.claim = c.UID
	}
	return st
}

// checkUndisturbed checks that each pod still runs its same container,
// never restarted, ready, with its claim allocated and reserved for it,
// prepared in its node's agent's checkpoint.
func (m *multiNode) checkUndisturbed(t *testing.T, before []podState) {
	t.Helper()
	for _, b := range before {
		p, err := m.c.Admin.CoreV1().Pods(m.ns).Get(m.ctx, b.name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("pod %s: %v", b.name, err)
			continue
		}
		cs := p.Status.ContainerStatuses
		switch {
		case p.UID != b.uid:
			t.Errorf("pod %s was replaced", b.name)
		case len(cs) != 1 || cs[0].ContainerID != b.container || cs[0].RestartCount != 0 || !cs[0].Ready:
			t.Errorf("pod %s on %s disturbed: container %+v, was %s", b.name, b.node, cs, b.container)
		}
		if b.claimName == "" {
			continue
		}
		c, err := m.c.Admin.ResourceV1().ResourceClaims(m.ns).Get(m.ctx, b.claimName, metav1.GetOptions{})
		if err != nil || c.UID != b.claim || c.Status.Allocation == nil ||
			!slices.ContainsFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == b.uid }) {
			t.Errorf("pod %s: claim %s lost its allocation or reservation (err %v)", b.name, b.claimName, err)
			continue
		}
		w := m.c.Worker(b.node)
		driver := c.Status.Allocation.Devices.Results[0].Driver
		rec, err := framework.ReadAgentRecords(w.AgentPodStateDir(), driver)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := rec.Claims[string(b.claim)]; !ok {
			t.Errorf("pod %s: claim %s not in the %s checkpoint on %s: %v", b.name, b.claimName, driver, b.node, rec.Claims)
		}
	}
}

// rollingUpdate: the DaemonSet rolls a new image across the four nodes
// while pods run on every one: each node's agent hands over, no pod is
// disturbed, no claim lost, and the new agents serve new pods.
func (m *multiNode) rollingUpdate(t *testing.T) {
	before := m.runningPods(t)
	nodes := map[string]bool{}
	for _, p := range before {
		nodes[p.node] = true
	}
	if len(nodes) != len(m.c.Workers) {
		t.Fatalf("pods run on %d nodes (%v), want every worker's", len(nodes), nodes)
	}
	values := m.c.AgentValues(t)
	values["image"].(map[string]any)["tag"] = framework.AgentImageTagNext
	began := time.Now()
	if err := m.c.UpgradeAgents(m.ctx, values, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	framework.Timing(t, "multinode-rolling-update", time.Since(began))
	want := framework.AgentImageDigests[framework.AgentImageTagNext]
	for _, w := range m.c.Workers {
		p, err := m.c.AgentPodOn(m.ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		if id := p.Status.ContainerStatuses[0].ImageID; !strings.HasSuffix(id, want) {
			t.Errorf("agent on %s runs image %s, want %s", w.Name, id, want)
		}
	}
	m.waitPublished(t)
	m.checkUndisturbed(t, before)
	s := m.scenario(t)
	r := s.runPod("after-update", s.template(exampleClaimNamed(t, "vf-share-10g.yaml", "after-update")), "multinode-after-update")
	if r.pod.Spec.NodeName != dgxNode && r.pod.Spec.NodeName != nicNode {
		t.Errorf("pod after-update runs on %s, a node without NICs", r.pod.Spec.NodeName)
	}
}

// drain: Deployments whose pods prefer the DGX (a MIG partition, an MPS
// share of one, a VF share) run there; the node drained (cordoned, its
// pods evicted) gives every claim back: the pods run again on the nodes
// that fit, and nothing of theirs is left on the DGX: its hardware as
// before (no MIG instance, VFs reset, compute mode back), no claim in its
// agent's checkpoint or ledger, no CDI spec, no MPS daemon.
func (m *multiNode) drain(t *testing.T) {
	if err := m.c.DeletePodsAndClaims(m.ctx, m.ns, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	s := m.scenario(t)
	dgx := m.c.Worker(dgxNode)
	idle := mockState(t, dgx)
	t.Cleanup(func() {
		// The Deployments, then their pods and claims, gone before the
		// next scenario.
		ctx := context.Background()
		err := m.c.Admin.AppsV1().Deployments(m.ns).DeleteCollection(ctx,
			metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}, metav1.ListOptions{})
		if err == nil {
			err = m.c.DeletePodsAndClaims(ctx, m.ns, 2*time.Minute)
		}
		if err != nil {
			t.Errorf("delete the Deployments: %v", err)
		}
	})
	// Only the DGX offers whole GPUs: the MPS share is of a MIG
	// partition, which the other GPU nodes have too.
	// (its pinned memory limit within a 1g.10gb's 10 GB).
	mps := exampleClaimNamed(t, "mig-1g.10gb.yaml", "d-mps")
	mps.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{
		Requests: []string{mps.Spec.Devices.Requests[0].Name},
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: gpuDriver,
			Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.hwdra.io/v1alpha1","kind":"GpuConfig",` +
				`"sharing":{"strategy":"MPS","mps":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"4Gi"}}}`)},
		}},
	}}
	apps := map[string]*resourceapi.ResourceClaim{
		"d-mig": exampleClaimNamed(t, "mig-1g.10gb.yaml", "d-mig"),
		"d-mps": mps,
		"d-vf":  exampleClaimNamed(t, "vf-share-10g.yaml", "d-vf"),
	}
	for name, claim := range apps {
		m.createDeployment(t, name, s.template(claim), dgxNode)
	}
	old := map[string]podState{}
	for name := range apps {
		p := m.waitDeploymentPod(t, name, func(p *corev1.Pod) bool { return p.Spec.NodeName == dgxNode })
		old[name] = p
	}
	if len(daemonLogs(t, dgx)) == 0 {
		t.Errorf("no MPS daemon on %s for d-mps's claim", dgxNode)
	}
	began := time.Now()
	m.drainNode(t, dgxNode)
	for name := range apps {
		p := m.waitDeploymentPod(t, name, func(p *corev1.Pod) bool { return p.Spec.NodeName != dgxNode })
		t.Logf("%s: pod %s now on %s", name, p.name, p.node)
	}
	framework.Timing(t, "multinode-drain-to-running-elsewhere", time.Since(began))
	for name, p := range old {
		if err := m.c.WaitPodGone(m.ctx, m.ns, p.name, 60*time.Second); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		m.waitClaimGone(t, p.claimName)
		if files := dgx.ClaimFiles(driverOfApp(name), m.ns, p.claimName, string(p.claim)); len(files) > 0 {
			t.Errorf("%s: claim %s left files on %s: %v", name, p.claimName, dgxNode, files)
		}
	}
	for _, d := range driversOf(dgxNode) {
		rec, err := framework.ReadAgentRecords(dgx.AgentPodStateDir(), d)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Claims) != 0 || len(rec.Ledger) != 0 || len(rec.Placements) != 0 {
			t.Errorf("%s on the drained node: claims %v, ledger %v, placements %v", d, rec.Claims, rec.Ledger, rec.Placements)
		}
	}
	if diff := framework.HardwareDiff(idle.Hardware(), mockState(t, dgx).Hardware()); diff != "" {
		t.Errorf("the drained node's hardware differs from before its pods (-before +after):\n%s", diff)
	}
	if mps := mpsDaemonsUnder(t, dgx); len(mps) > 0 {
		t.Errorf("MPS control daemons still run for the drained node: %v", mps)
	}
	m.cordon(t, dgxNode, false)
}

// mpsDaemonsUnder are the MPS control daemons the node's agent started
// that were not told to quit (their logs under its state directory).
func mpsDaemonsUnder(t *testing.T, w *framework.Node) map[string][]drivertools.MPSEvent {
	t.Helper()
	left := map[string][]drivertools.MPSEvent{}
	for id, ev := range daemonLogs(t, w) {
		if len(ev) == 0 || ev[len(ev)-1].Event != "exit" {
			left[id] = ev
		}
	}
	return left
}

// driverOfApp is the driver of a drain scenario's Deployment's claim.
func driverOfApp(name string) string {
	if name == "d-vf" {
		return nicDriver
	}
	return gpuDriver
}

// createDeployment creates a one-pod Deployment of the test app whose
// claim comes from template and which prefers node.
func (m *multiNode) createDeployment(t *testing.T, name, template, node string) {
	t.Helper()
	pod := framework.PodWithClaimTemplate(name, template)
	pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
			Weight: 100,
			Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node},
			}}},
		}},
	}}
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			// One pod at a time: the claim's devices are the node's.
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: pod.Spec},
		},
	}
	if _, err := m.c.Admin.AppsV1().Deployments(m.ns).Create(m.ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitDeploymentPod waits until the Deployment's pod for which cond holds
// runs and is ready, and returns it.
func (m *multiNode) waitDeploymentPod(t *testing.T, app string, cond func(*corev1.Pod) bool) podState {
	t.Helper()
	var found *corev1.Pod
	waitfor.NoError(t, "Deployment "+app+": a ready pod as wanted", 2*time.Minute, func() error {
		list, err := m.c.Admin.CoreV1().Pods(m.ns).List(m.ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return err
		}
		var states []string
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && cond(&p) && framework.PodReady(&p) {
				found = &p
				return nil
			}
			states = append(states, fmt.Sprintf("%s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase))
		}
		return fmt.Errorf("%v", states)
	})
	return m.stateOf(t, found)
}

// cordon marks the node (un)schedulable, as kubectl cordon does.
func (m *multiNode) cordon(t *testing.T, node string, on bool) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	if _, err := m.c.Admin.CoreV1().Nodes().Patch(m.ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// drainNode does what kubectl drain does: cordon, then evict every pod
// on the node that no DaemonSet owns, through the Eviction API.
func (m *multiNode) drainNode(t *testing.T, node string) {
	t.Helper()
	m.cordon(t, node, true)
	list, err := m.c.Admin.CoreV1().Pods("").List(m.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.Kind == "DaemonSet" {
			continue
		}
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}}
		if err := m.c.Admin.CoreV1().Pods(p.Namespace).EvictV1(m.ctx, ev); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("evict %s/%s: %v", p.Namespace, p.Name, err)
		}
	}
}

// waitClaimGone waits until the claim is deleted (the resourceclaim
// controller deletes a template's claim once its pod is gone and the
// kubelet unprepared it).
func (m *multiNode) waitClaimGone(t *testing.T, name string) {
	t.Helper()
	if err := waitfor.Until(m.ctx, "claim "+name+" gone after its pod was evicted", 60*time.Second, func() bool {
		_, err := m.c.Admin.ResourceV1().ResourceClaims(m.ns).Get(m.ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}); err != nil {
		t.Error(err)
	}
}

// nodeLost: the vGPU host's kubelet and agent are killed while a vGPU pod
// runs there. The node goes NotReady; the other nodes keep serving and
// publishing. The kubelet back, the agent (restarted by it) reconciles
// what it had: the pod runs on, undisturbed, its vGPU kept, and is
// unprepared for real when deleted.
func (m *multiNode) nodeLost(t *testing.T) {
	s := m.scenario(t)
	w := m.c.Worker(vgpuNode)
	s.runPod("vgpu-lost", s.template(exampleClaimNamed(t, "vgpu.yaml", "vgpu-lost")), "multinode-vgpu-before-loss")
	before := m.runningPods(t)
	others := map[string]int{}
	for _, o := range m.c.Workers {
		if o != w {
			others[o.Name] = m.sliceCount(t, o)
		}
	}

	w.Kubelet.Kill()
	if w.KillAgent(t.Logf) == 0 {
		t.Fatal("no agent process found on the lost node")
	}
	lost := time.Now()
	m.waitNodeReady(t, w, corev1.ConditionUnknown, 90*time.Second)
	framework.Timing(t, "multinode-node-lost-to-not-ready", time.Since(lost))

	r := s.runPod("while-lost", s.template(exampleClaimNamed(t, "vf-share-10g.yaml", "while-lost")), "multinode-pod-while-node-lost")
	if r.pod.Spec.NodeName == vgpuNode {
		t.Errorf("pod while-lost placed on the lost node")
	}
	for name, n := range others {
		if got := m.sliceCount(t, m.c.Worker(name)); got != n {
			t.Errorf("node %s publishes %d slices while %s is lost, %d before", name, got, vgpuNode, n)
		}
	}

	back := time.Now()
	if err := w.Kubelet.Start(); err != nil {
		t.Fatal(err)
	}
	m.waitNodeReady(t, w, corev1.ConditionTrue, 90*time.Second)
	if err := m.c.WaitAgents(m.ctx, len(m.c.Workers), 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	framework.Timing(t, "multinode-node-back-to-agent-ready", time.Since(back))
	m.waitPublished(t)
	m.checkUndisturbed(t, before)
	if st := mockState(t, w); len(st.Mdevs) != 1 {
		t.Errorf("vgpu node after its return: %d vGPUs, want the pod's 1", len(st.Mdevs))
	}
	s.deletePod("vgpu-lost")
	if _, err := framework.WaitMockState(m.ctx, w.WorkerMockDir(), 60*time.Second, "no vGPU", func(st persist.State) bool {
		return len(st.Mdevs) == 0
	}); err != nil {
		t.Error(err)
	}
}

func exampleClaimNamed(t *testing.T, file, name string) *resourceapi.ResourceClaim {
	c := exampleClaim(t, file)
	c.Name = name
	return c
}

func (m *multiNode) sliceCount(t *testing.T, w *framework.Node) int {
	t.Helper()
	list, err := m.c.Admin.ResourceV1().ResourceSlices().List(m.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + w.Name})
	if err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

// waitNodeReady waits until the node's Ready condition is status.
func (m *multiNode) waitNodeReady(t *testing.T, w *framework.Node, status corev1.ConditionStatus, timeout time.Duration) {
	t.Helper()
	waitfor.True(t, fmt.Sprintf("node %s Ready=%s", w.Name, status), timeout, func() bool {
		node, err := m.c.Admin.CoreV1().Nodes().Get(m.ctx, w.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == status {
				return true
			}
		}
		return false
	})
}
