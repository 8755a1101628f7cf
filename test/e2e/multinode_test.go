// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	resourcealpha "k8s.io/api/resource/v1alpha3"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/waitfor"
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
// and RollingUpdate with bare pods; Drain with Deployments; NodeLost;
// RefusedSlices and NodeVanishes (multinode_faults_test.go).
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
		{"RefusedSlices", m.refusedSlices},
		{"NodeVanishes", m.nodeVanishes},
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
	waitfor.NoError(t, fmt.Sprintf("node %s: devices of %d GPUs tainted", w.Name, gpus), 60*time.Second, func() error {
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
		if len(tainted) != gpus {
			return fmt.Errorf("%d GPUs tainted", len(tainted))
		}
		return nil
	})
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
	samePools(t, ours, controller)
	// Pods run on every worker: the two agree on allocations, not only
	// on idle pools.
	allocated := 0
	for _, p := range controller {
		allocated += int(ptr.Deref(p.AllocatedDevices, 0))
	}
	if allocated == 0 {
		t.Errorf("the controller counts no allocated device in any pool")
	}
}
