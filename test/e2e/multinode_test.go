package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	resourcealpha "k8s.io/api/resource/v1alpha3"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/mock/drivertools"
	"github.com/hwdra/hwdra/mock/persist"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// The multi-node scenarios: one control plane and four workers, each in
// its own network and mount namespace with its own kubelet, containerd
// and mock hardware (framework/cluster.go), the agent on every one from
// the chart's one DaemonSet:
//
//	dgx   a DGX H100: 8 GPUs (MIG capable) and 10 ConnectX-7 NICs
//	mig   8 H100s in MIG mode, a 3g.40gb instance on each, no NIC
//	vgpu  2 H100s that host vGPUs, no NIC
//	nic   2 ConnectX-7 NICs, no GPU
//
// They run in order on the one cluster (booting one costs a minute on
// this machine): Placement, FitsOnlyAcrossNodes, HealthFault, PoolStatus
// and RollingUpdate with bare pods; Drain with Deployments; NodeLost.
const (
	dgxNode, migNode, vgpuNode, nicNode = "dgx", "mig", "vgpu", "nic"
	// nicOnlyPF is the first PF of the nic worker (mock/profile cx7.yaml);
	// no other worker has a PF at that address.
	nicOnlyPF = "0000:17:00.0"

	attrPCIBusID resourceapi.QualifiedName = "resource.kubernetes.io/pciBusID"
)

// multiNode is the cluster and the namespace the scenarios share.
type multiNode struct {
	c   *framework.Cluster
	ns  string
	ctx context.Context
}

func TestMultiNode(t *testing.T) {
	c := framework.NewCluster(t,
		framework.WorkerSpec{Name: dgxNode, Profile: "dgx-h100"},
		framework.WorkerSpec{Name: migNode, Profile: "h100-mig"},
		framework.WorkerSpec{Name: vgpuNode, Profile: "h100-vgpu"},
		framework.WorkerSpec{Name: nicNode, Profile: "cx7"})
	began := time.Now()
	c.InstallAgents(t, c.AgentValues(t))
	m := &multiNode{c: c, ctx: context.Background()}
	m.waitPublished(t)
	framework.Timing(t, "multinode-agents-serving", time.Since(began))
	m.ns = c.CreateNamespace(t, "multinode")
	t.Cleanup(func() {
		if err := c.DeletePodsAndClaims(context.Background(), m.ns, 2*time.Minute); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	for _, s := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Placement", m.placement},
		{"FitsOnlyAcrossNodes", m.fitsOnlyAcrossNodes},
		{"HealthFault", m.healthFault},
		{"PoolStatus", m.poolStatus},
		{"RollingUpdate", m.rollingUpdate},
		{"Drain", m.drain},
		{"NodeLost", m.nodeLost},
	} {
		if !t.Run(s.name, s.run) {
			return // the later scenarios build on what the earlier left
		}
	}
}

// driversOf are the drivers that publish on a worker.
func driversOf(name string) []string {
	switch name {
	case dgxNode:
		return []string{gpuDriver, nicDriver}
	case nicNode:
		return []string{nicDriver}
	}
	return []string{gpuDriver}
}

// waitPublished waits until every worker's drivers have published all of
// their slices and registered with its kubelet.
func (m *multiNode) waitPublished(t *testing.T) {
	t.Helper()
	for _, w := range m.c.Workers {
		for _, d := range driversOf(w.Name) {
			if _, err := w.WaitPoolsComplete(m.ctx, d, 90*time.Second); err != nil {
				t.Fatal(err)
			}
			if err := w.WaitDriverRegistered(m.ctx, d, 0, 30*time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// scenario is the pod scenarios' helper on the cluster's namespace.
func (m *multiNode) scenario(t *testing.T) *scenario {
	return &scenario{t: t, n: m.c.Node, ns: m.ns, ctx: m.ctx}
}

// onNode checks that the pod runs on want and that each of its claim's
// results is a device of want's pools (the pool is the node's name).
func onNode(t *testing.T, r ran, want string) {
	t.Helper()
	if r.pod.Spec.NodeName != want {
		t.Errorf("pod %s runs on %q, want %q", r.pod.Name, r.pod.Spec.NodeName, want)
	}
	for _, res := range r.claim.Status.Allocation.Devices.Results {
		if res.Pool != want {
			t.Errorf("pod %s: claim %s request %s got %s/%s, not a device of node %s", r.pod.Name, r.claim.Name, res.Request, res.Pool, res.Device, want)
		}
	}
	if !selectsOnly(r.claim.Status.Allocation.NodeSelector, want) {
		t.Errorf("claim %s: allocation's node selector %v is not node %s alone", r.claim.Name, r.claim.Status.Allocation.NodeSelector, want)
	}
}

// selectsOnly says whether an allocation's node selector is the one node
// (the allocator writes metadata.name In [node]).
func selectsOnly(sel *corev1.NodeSelector, node string) bool {
	if sel == nil || len(sel.NodeSelectorTerms) != 1 {
		return false
	}
	f := sel.NodeSelectorTerms[0].MatchFields
	return len(f) == 1 && f[0].Key == "metadata.name" && f[0].Operator == corev1.NodeSelectorOpIn && slices.Equal(f[0].Values, []string{node})
}

// templateWithSelector is a template from an example claim with one more
// CEL selector on its only request.
func (m *multiNode) templateWithSelector(s *scenario, file, name, cel string) string {
	s.t.Helper()
	claim := exampleClaim(s.t, file)
	claim.Name = name
	req := &claim.Spec.Devices.Requests[0]
	req.Exactly.Selectors = append(req.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: cel}})
	return s.template(claim)
}

// placement: each pod lands on the only node whose hardware fits its
// claim, proven in the pod's node, the claim's allocation and inside the
// container.
func (m *multiNode) placement(t *testing.T) {
	s := m.scenario(t)
	// A GPU and a VF on one NUMA node: only the DGX has both.
	r := s.runPod("numa", s.template(exampleClaimNamed(t, "gpu-and-vf-same-numa.yaml", "numa")), "multinode-gpu-vf", "/dev")
	onNode(t, r, dgxNode)
	dgx := m.c.Worker(dgxNode)
	var numa []string
	for _, req := range []string{"gpu", "nic"} {
		res := result(t, r.claim, req)
		d, err := dgx.PublishedDevice(m.ctx, res.Driver, res.Pool, res.Device)
		if err != nil {
			t.Fatal(err)
		}
		numa = append(numa, sliceAttr(d, attrNUMANode))
	}
	if numa[0] == "" || numa[0] != numa[1] {
		t.Errorf("GPU on NUMA node %q, VF on %q: want one", numa[0], numa[1])
	}
	if !anyNvidiaGPU(r.out.Devices) {
		t.Errorf("pod numa: no GPU device node in the container: %v", r.out.Devices)
	}
	if checkCDI(t, dgx, gpuDriver, r) == nil {
		t.Errorf("no %s CDI spec on %s for claim %s", gpuDriver, dgxNode, r.claim.Name)
	}

	// A vGPU: only the vGPU host.
	vgpus := mockState(t, m.c.Worker(vgpuNode))
	r = s.runPod("vgpu", s.template(exampleClaimNamed(t, "vgpu.yaml", "vgpu")), "multinode-vgpu", "/dev")
	onNode(t, r, vgpuNode)
	if checkCDI(t, m.c.Worker(vgpuNode), gpuDriver, r) == nil {
		t.Errorf("no %s CDI spec on %s for claim %s", gpuDriver, vgpuNode, r.claim.Name)
	}
	if st := mockState(t, m.c.Worker(vgpuNode)); len(st.Mdevs) != len(vgpus.Mdevs)+1 {
		t.Errorf("vgpu node: %d vGPUs in its hardware, %d before the pod", len(st.Mdevs), len(vgpus.Mdevs))
	}

	// A VF share whose selector only the NIC-only node's PF satisfies;
	// the VF is in the container.
	tmpl := m.templateWithSelector(s, "vf-share-10g.yaml", "vf-pinned", `device.attributes["sriov.hwdra.io"].pfPciAddress == "`+nicOnlyPF+`"`)
	r = s.runPod("vf-pinned", tmpl, "multinode-vf-selector")
	onNode(t, r, nicNode)
	if len(podInterfaces(r)) == 0 {
		t.Errorf("pod vf-pinned: no VF among the container's interfaces %v", r.out.Interfaces)
	}

	// A MIG partition pinned to the MIG node by the pod's node selector
	// (the DGX fits it too): the instance is made on that node's GPU.
	instances := mockState(t, m.c.Worker(migNode)).GPUInstanceCount()
	pod := framework.PodWithClaimTemplate("mig", s.template(exampleClaimNamed(t, "mig-1g.10gb.yaml", "mig")))
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: migNode}
	r = s.waitRunning("mig", "multinode-mig", s.createPodFor(pod))
	onNode(t, r, migNode)
	if got := mockState(t, m.c.Worker(migNode)).GPUInstanceCount(); got != instances+1 {
		t.Errorf("mig node: %d GPU instances, %d before the pod", got, instances)
	}
}

// mockState is the worker's hardware as its mock keeps it.
func mockState(t *testing.T, w *framework.Node) persist.State {
	t.Helper()
	st, err := persist.ReadState(w.WorkerMockDir())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// podInterfaces are the container's interfaces besides loopback and the
// pod network's eth0: the VFs.
func podInterfaces(r ran) []string {
	var out []string
	for name := range r.out.Interfaces {
		if name != "lo" && name != "eth0" {
			out = append(out, name)
		}
	}
	return out
}

// fitsOnlyAcrossNodes: a claim for a vGPU and a VF fits no single node
// (the vGPU host has no NIC): its pod stays Pending with the scheduler's
// reason, and the pods behind it are placed as usual.
func (m *multiNode) fitsOnlyAcrossNodes(t *testing.T) {
	s := m.scenario(t)
	claim := exampleClaim(t, "vgpu.yaml")
	claim.Name = "vgpu-and-vf"
	vf := exampleClaim(t, "vf-share-10g.yaml").Spec.Devices.Requests[0]
	claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, vf)
	s.createPod("across", s.template(claim))
	_, reason, err := m.c.WaitPodUnschedulable(m.ctx, m.ns, "across", 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod across: %s", reason)
	// Behind it, a pod that fits is placed at once.
	r := s.runPod("behind", s.template(exampleClaimNamed(t, "vf-share-10g.yaml", "behind")), "multinode-behind-unfittable")
	if r.pod.Spec.NodeName != dgxNode && r.pod.Spec.NodeName != nicNode {
		t.Errorf("pod behind runs on %s, a node without NICs", r.pod.Spec.NodeName)
	}
	if err := m.c.CheckPodStaysPending(m.ctx, m.ns, "across", 5*time.Second); err != nil {
		t.Error(err)
	}
	s.deletePod("across")
}

// healthFault: an XID 79 on every GPU of the MIG node taints its devices
// in the API; a new MIG pod goes to another node that has MIG partitions
// (the DGX or the vGPU host). Cleared, the taints go.
func (m *multiNode) healthFault(t *testing.T) {
	s := m.scenario(t)
	w := m.c.Worker(migNode)
	gpus := gpuBusIDs(t, m.ctx, w)
	for _, bus := range gpus {
		hwdraInject(t, w.WorkerMockDir(), "xid", "--gpu", bus, "--code", "79")
	}
	injected := time.Now()
	m.waitTainted(t, w, len(gpus))
	framework.Timing(t, "multinode-xid-to-taints", time.Since(injected))

	r := s.runPod("after-fault", s.template(exampleClaimNamed(t, "mig-1g.10gb.yaml", "after-fault")), "multinode-mig-after-fault")
	if r.pod.Spec.NodeName == migNode {
		t.Errorf("pod after-fault placed on the faulted node %s", migNode)
	}
	onNode(t, r, r.pod.Spec.NodeName)

	for _, bus := range gpus {
		hwdraInject(t, w.WorkerMockDir(), "clear", "--gpu", bus)
	}
	m.waitTainted(t, w, 0)
}

// gpuBusIDs are the PCI addresses of the GPUs a worker publishes.
func gpuBusIDs(t *testing.T, ctx context.Context, w *framework.Node) []string {
	t.Helper()
	list, err := w.WaitPoolsComplete(ctx, gpuDriver, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, sl := range list {
		for _, d := range sl.Spec.Devices {
			if bus := sliceAttr(&d, attrPCIBusID); bus != "" && !slices.Contains(out, bus) {
				out = append(out, bus)
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("node %s publishes no GPU", w.Name)
	}
	return out
}

// waitTainted waits until the worker's GPU devices are tainted on exactly
// gpus GPUs (0: no taint at all).
func (m *multiNode) waitTainted(t *testing.T, w *framework.Node, gpus int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		list, err := w.WaitPoolsComplete(m.ctx, gpuDriver, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		tainted := map[string]bool{}
		for _, sl := range list {
			for _, d := range sl.Spec.Devices {
				if len(d.Taints) > 0 {
					tainted[sliceAttr(&d, attrPCIBusID)] = true
				}
			}
		}
		if len(tainted) == gpus {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: devices of %d GPUs tainted after 60s, want %d", w.Name, len(tainted), gpus)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// poolStatus: `hwdra pool-status -o json` for the whole cluster reports
// what kube-controller-manager does for every pool of every node.
func (m *multiNode) poolStatus(t *testing.T) {
	var controller []resourcealpha.PoolStatus
	for _, d := range []string{gpuDriver, nicDriver} {
		controller = append(controller, requestPoolStatus(t, m.c.Node, d, "")...)
	}
	// dgx, mig and vgpu publish GPUs; dgx and nic NICs.
	if len(controller) != 5 {
		t.Fatalf("controller reported %d pools, want 5: %+v", len(controller), controller)
	}
	ours := hwdraPoolStatus(t, m.c.Node, "")
	if len(ours.Pools) != len(controller) {
		t.Fatalf("hwdra pool-status reports %d pools, the controller %d", len(ours.Pools), len(controller))
	}
	for i, want := range controller {
		got := ours.Pools[i].PoolStatus
		if !equality.Semantic.DeepEqual(got, want) {
			g, _ := json.Marshal(got)
			w, _ := json.Marshal(want)
			t.Errorf("pool %s/%s:\n  hwdra pool-status %s\n  controller        %s", want.Driver, want.PoolName, g, w)
		}
		if ptr.Deref(want.AllocatedDevices, 0) == 0 && want.PoolName != vgpuNode {
			t.Logf("pool %s/%s: nothing allocated", want.Driver, want.PoolName)
		}
	}
}

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
		st := podState{name: p.Name, node: p.Spec.NodeName, uid: p.UID, container: p.Status.ContainerStatuses[0].ContainerID}
		if len(p.Status.ResourceClaimStatuses) == 1 && p.Status.ResourceClaimStatuses[0].ResourceClaimName != nil {
			st.claimName = *p.Status.ResourceClaimStatuses[0].ResourceClaimName
			c, err := m.c.Admin.ResourceV1().ResourceClaims(m.ns).Get(m.ctx, st.claimName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			st.claim = c.UID
		}
		out = append(out, st)
	}
	return out
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
	deadline := time.Now().Add(2 * time.Minute)
	for {
		list, err := m.c.Admin.CoreV1().Pods(m.ns).List(m.ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err == nil {
			for _, p := range list.Items {
				if p.DeletionTimestamp != nil || !cond(&p) || !podIsReady(&p) {
					continue
				}
				st := podState{name: p.Name, node: p.Spec.NodeName, uid: p.UID}
				if len(p.Status.ResourceClaimStatuses) == 1 && p.Status.ResourceClaimStatuses[0].ResourceClaimName != nil {
					st.claimName = *p.Status.ResourceClaimStatuses[0].ResourceClaimName
					if c, err := m.c.Admin.ResourceV1().ResourceClaims(m.ns).Get(m.ctx, st.claimName, metav1.GetOptions{}); err == nil {
						st.claim = c.UID
					}
				}
				return st
			}
		}
		if time.Now().After(deadline) {
			var states []string
			if list != nil {
				for _, p := range list.Items {
					states = append(states, fmt.Sprintf("%s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase))
				}
			}
			t.Fatalf("Deployment %s: no ready pod as wanted after 2m (err %v): %v", app, err, states)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
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
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := m.c.Admin.ResourceV1().ResourceClaims(m.ns).Get(m.ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("claim %s still there 60s after its pod was evicted (err %v)", name, err)
			return
		}
		time.Sleep(300 * time.Millisecond)
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
	deadline := time.Now().Add(timeout)
	for {
		node, err := m.c.Admin.CoreV1().Nodes().Get(m.ctx, w.Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == status {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not Ready=%s after %v", w.Name, status, timeout)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
