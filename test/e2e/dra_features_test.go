// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// The agent's GPU health timeout (internal/agent/health.go): the kubelet
// hears a stalled monitor's devices Unknown within it.
const gpuHealthTimeout = 45 * time.Second

// podHealth is the health of the pod's claim "devices" (one device) as
// the kubelet reports it in the container's allocatedResourcesStatus.
func podHealth(p *corev1.Pod) (corev1.ResourceHealth, bool) {
	for _, cs := range p.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			if rs.Name == "claim:devices" && len(rs.Resources) == 1 {
				return rs.Resources[0], true
			}
		}
	}
	return corev1.ResourceHealth{}, false
}

func healthIs(want corev1.ResourceHealthStatus, message string) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		h, ok := podHealth(p)
		if !ok || h.Health != want {
			return false
		}
		if message == "" {
			return h.Message == nil
		}
		return h.Message != nil && strings.Contains(*h.Message, message)
	}
}

// TestHealthUnknownStalledMonitor: a pod runs on a whole GPU, Healthy in
// its status as the real kubelet reports it. The GPU stops answering (the
// mock's stall: its health queries block and its events are held, as a
// GPU hung in the driver), which stalls the agent's GPU health monitor:
// within the kubelet's health timeout for GPUs the pod's
// allocatedResourcesStatus says Unknown, with the agent's message naming
// the monitor. When the GPU answers again the pod's device is Healthy
// again, and the pod is unprepared cleanly.
func TestHealthUnknownStalledMonitor(t *testing.T) {
	r := startHWRig(t, "health-stall", "mock:dgx-h100", nil, gpuDriver)
	before := r.state()
	began := r.createPod("gpu", r.template("gpu-full.yaml"))
	claim, _ := r.waitRunning("gpu", "health-stall-pod-running", began)
	res := claim.Status.Allocation.Devices.Results[0]
	published, err := r.n.PublishedDevice(r.ctx, res.Driver, res.Pool, res.Device)
	if err != nil {
		t.Fatal(err)
	}
	gpu := sliceAttr(published, "resource.kubernetes.io/pciBusID")
	if _, err := r.n.WaitPod(r.ctx, r.ns, "gpu", 60*time.Second, "its device reported Healthy", healthIs(corev1.ResourceHealthStatusHealthy, "")); err != nil {
		t.Fatal(err)
	}

	stalled := time.Now()
	hwdraInject(t, r.mockDir, "stall", "--gpu", gpu)
	resumed := false
	t.Cleanup(func() { // a check blocked on the GPU would hold the agent's NVML
		if !resumed {
			hwdraInject(t, r.mockDir, "resume", "--gpu", gpu)
		}
	})
	pod, err := r.n.WaitPod(r.ctx, r.ns, "gpu", gpuHealthTimeout+30*time.Second, "its device reported Unknown",
		healthIs(corev1.ResourceHealthStatusUnknown, "the GPU health monitor (NVML events and checks) has completed no check"))
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(stalled)
	framework.Timing(t, "health-stall-to-unknown-in-pod-status", took)
	if took > gpuHealthTimeout {
		t.Errorf("the pod's device turned Unknown %v after the stall, over the GPU health timeout %v", took, gpuHealthTimeout)
	}
	h, _ := podHealth(pod)
	t.Logf("pod status: %s %s %q", h.ResourceID, h.Health, *h.Message)

	back := time.Now()
	hwdraInject(t, r.mockDir, "resume", "--gpu", gpu)
	resumed = true
	if _, err := r.n.WaitPod(r.ctx, r.ns, "gpu", 60*time.Second, "its device Healthy again", healthIs(corev1.ResourceHealthStatusHealthy, "")); err != nil {
		t.Fatal(err)
	}
	framework.Timing(t, "health-resume-to-healthy-in-pod-status", time.Since(back))
	r.deletePodAndCheck("gpu", gpuDriver, "health-stall-delete-to-unprepared", claim, before)
}

// TestHealthUnknownPassthrough: a pod's GPU bound to vfio-pci, which NVML
// cannot see, is Unknown in the pod's status as the kubelet reports it,
// with the agent's reason, never Healthy, over two of the agent's
// re-sends.
func TestHealthUnknownPassthrough(t *testing.T) {
	r := startHWRig(t, "health-vfio", "mock:h100-vm", nil, gpuDriver)
	before := r.state()
	began := r.createPod("vm", r.template("passthrough.yaml"))
	claim, _ := r.waitRunning("vm", "health-passthrough-pod-running", began)
	const reason = "a GPU bound to vfio-pci is invisible to NVML"
	if _, err := r.n.WaitPod(r.ctx, r.ns, "vm", 60*time.Second, "its device reported Unknown with the reason", healthIs(corev1.ResourceHealthStatusUnknown, reason)); err != nil {
		t.Fatal(err)
	}
	// Two re-sends later (every 15 s) the kubelet still reports it so:
	// watched, not sampled.
	ctx, cancel := context.WithTimeout(r.ctx, 2*gpuHealthTimeout/3+5*time.Second)
	defer cancel()
	w, err := r.n.Admin.CoreV1().Pods(r.ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=vm"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type != watch.Deleted && !healthIs(corev1.ResourceHealthStatusUnknown, reason)(p) {
			h, _ := podHealth(p)
			t.Fatalf("the passthrough GPU's health in the pod's status became %+v", h)
		}
	}
	r.deletePodAndCheck("vm", gpuDriver, "health-passthrough-delete-to-unprepared", claim, before)
}

// TestClaimStatusGPU: through the chart's agent pod (its own node-bound
// token, the chart's RBAC with granular status authorization), a MIG pod's
// and a GPU share pod's claims each get a gpu.hwdra.io entry in
// status.devices, as `kubectl get resourceclaim -o yaml` shows: Ready,
// with the MIG device's UUID, its GPU's and its instance IDs, the share's
// limits and the MPS pipe directory in the container. The API server saw
// one write of the driver's entries per claim (a watch on the claims),
// and the agent counted the same (hwdra_claim_status_writes_total).
func TestClaimStatusGPU(t *testing.T) {
	s := startScenario(t, "claim-status-gpu", "mock:dgx-h100", gpuDriver)
	watched, stop := watchGPUEntryWrites(t, s)
	defer stop()
	mig := s.runPod("mig", s.template(exampleClaim(t, "mig-1g.10gb.yaml")), "claim-status-mig-running")
	share := s.runPod("share", s.template(exampleClaim(t, "gpu-share.yaml")), "claim-status-share-running")

	_, d := waitGPUEntry(t, s, mig.claim)
	if !strings.HasPrefix(d.UUID, "MIG-") || !strings.HasPrefix(d.ParentUUID, "GPU-") || d.GPUInstanceID == nil || d.ComputeInstanceID == nil ||
		d.Profile != "1g.10gb" || d.Type != "mig" || d.PCIBusID == "" {
		t.Errorf("MIG claim's data %+v", d)
	}
	want := resultOf(t, share.claim)
	_, d = waitGPUEntry(t, s, share.claim)
	memory, compute := want.ConsumedCapacity["gpu.hwdra.io/memory"], want.ConsumedCapacity["gpu.hwdra.io/compute"]
	if d.Share == nil || d.Share.ActiveThreadPercentage != compute.Value() || d.Share.PinnedMemoryLimitMiB != memory.Value()>>20 ||
		d.MPSPipeDirectory != "/tmp/nvidia-mps" || !strings.HasPrefix(d.UUID, "GPU-") {
		t.Errorf("share claim's data %+v (consumed %s, %s)", d, memory.String(), compute.String())
	}

	// The watch may lag the reads above by a moment: wait for what it
	// must see; more shows at the end.
	_ = waitfor.Until(s.ctx, "the watch's two writes", 10*time.Second, func() bool { return watched() >= 2 }) // checked below, with the agent's count
	n, err := framework.AgentMetric(framework.AgentAddr, `hwdra_claim_status_writes_total{driver="gpu.hwdra.io",result="success"}`)
	if err != nil {
		t.Fatal(err)
	}
	other := 0
	for _, r := range []string{"refused", "gone", "error"} {
		v, _ := framework.AgentMetric(framework.AgentAddr, `hwdra_claim_status_writes_total{driver="gpu.hwdra.io",result="`+r+`"}`)
		x, _ := strconv.Atoi(v)
		other += x
	}
	seen := watched()
	t.Logf("API WRITES claim-status-gpu: agent counted %s successful and %d other requests for 2 claims; the API server's watch saw %d writes of gpu.hwdra.io entries", n, other, seen)
	if n != "2" || seen != 2 {
		t.Errorf("GPU claim status: %s successful writes counted, %d seen by the API server's watch; want 2 each (one per claim)", n, seen)
	}
	s.deletePod("mig")
	s.deletePod("share")
	if seen := watched(); seen != 2 {
		t.Errorf("the API server's watch saw %d writes of gpu.hwdra.io entries by the end (deletion included), want 2", seen)
	}
}

// resultOf is a claim's one allocation result.
func resultOf(t *testing.T, c *resourceapi.ResourceClaim) resourceapi.DeviceRequestAllocationResult {
	t.Helper()
	if c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s: allocation %+v, want one device", c.Name, c.Status.Allocation)
	}
	return c.Status.Allocation.Devices.Results[0]
}

// waitGPUEntry waits for the gpu.hwdra.io entry of a claim's
// status.devices, checks its keys and Ready condition, and returns it with
// its data.
func waitGPUEntry(t *testing.T, s *scenario, c *resourceapi.ResourceClaim) (resourceapi.AllocatedDeviceStatus, metadata.GPUData) {
	t.Helper()
	var entry resourceapi.AllocatedDeviceStatus
	waitfor.NoError(t, "claim "+c.Name+"'s "+gpuDriver+" entry in status.devices", 30*time.Second, func() error {
		got, err := s.n.Admin.ResourceV1().ResourceClaims(c.Namespace).Get(s.ctx, c.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range got.Status.Devices {
			if d.Driver == gpuDriver {
				entry = d
				return nil
			}
		}
		return fmt.Errorf("status.devices %+v", got.Status.Devices)
	})
	res := resultOf(t, c)
	if entry.Pool != res.Pool || entry.Device != res.Device || (entry.ShareID == nil) != (res.ShareID == nil) ||
		(res.ShareID != nil && *entry.ShareID != string(*res.ShareID)) {
		t.Errorf("claim %s: entry %s/%s share %v, allocated %s/%s share %v", c.Name, entry.Pool, entry.Device, entry.ShareID, res.Pool, res.Device, res.ShareID)
	}
	ready := apimeta.FindStatusCondition(entry.Conditions, metadata.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionTrue {
		t.Errorf("claim %s: conditions %+v, want Ready True", c.Name, entry.Conditions)
	}
	var d metadata.GPUData
	if entry.Data == nil || json.Unmarshal(entry.Data.Raw, &d) != nil {
		t.Fatalf("claim %s: entry without data: %+v", c.Name, entry)
	}
	yaml, _ := json.Marshal(entry)
	t.Logf("claim %s status.devices: %s", c.Name, yaml)
	return entry, d
}

// watchGPUEntryWrites watches the scenario's namespace's claims through
// the API server and counts the updates that change their gpu.hwdra.io
// entries of status.devices (their removal at deallocation, by the API
// server, is not counted).
func watchGPUEntryWrites(t *testing.T, s *scenario) (count func() int, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(s.ctx)
	w, err := s.n.Admin.ResourceV1().ResourceClaims(s.ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	go func() {
		last := map[string][]resourceapi.AllocatedDeviceStatus{}
		for ev := range w.ResultChan() {
			c, ok := ev.Object.(*resourceapi.ResourceClaim)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			var ours []resourceapi.AllocatedDeviceStatus
			for _, d := range c.Status.Devices {
				if d.Driver == gpuDriver {
					ours = append(ours, d)
				}
			}
			if ev.Type == watch.Modified && len(ours) > 0 && !equality.Semantic.DeepEqual(ours, last[c.Name]) {
				n.Add(1)
			}
			last[c.Name] = ours
		}
	}()
	return func() int { return int(n.Load()) }, func() { cancel(); w.Stop() }
}
