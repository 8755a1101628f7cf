// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestHealthXIDInPodStatus: a pod runs on a MIG partition; the kubelet's
// PodResources List names its claim's device with our driver and pool.
// An XID 79 injected on the partition's GPU (`hwdra mock inject`, as an
// operator would) shows in the pod's status as the real kubelet reports it
// (containerStatuses[].allocatedResourcesStatus: Unhealthy with the XID in
// the message), and the slices in the API carry the taint on exactly that
// GPU's devices. After `hwdra mock inject clear` both are back: Healthy,
// no taint.
func TestHealthXIDInPodStatus(t *testing.T) {
	r := startHWRig(t, "health-xid", "mock:dgx-h100", nil, gpuDriver)
	before := r.state()
	tmpl := r.template("mig-1g.10gb.yaml")
	began := r.createPod("mig", tmpl)
	claim, _ := r.waitRunning("mig", "health-pod-running", began)
	res := claim.Status.Allocation.Devices.Results[0]
	published, err := r.n.PublishedDevice(r.ctx, res.Driver, res.Pool, res.Device)
	if err != nil {
		t.Fatal(err)
	}
	gpu := sliceAttr(published, "resource.kubernetes.io/pciBusID")
	t.Logf("pod mig runs on %s (GPU %s)", res.Device, gpu)

	checkPodResources(t, r.n, r.ns, "mig", res)

	health := func(p *corev1.Pod) (corev1.ResourceHealth, bool) {
		for _, cs := range p.Status.ContainerStatuses {
			for _, rs := range cs.AllocatedResourcesStatus {
				if rs.Name == "claim:devices" && len(rs.Resources) == 1 {
					return rs.Resources[0], true
				}
			}
		}
		return corev1.ResourceHealth{}, false
	}
	if _, err := r.n.WaitPod(r.ctx, r.ns, "mig", 60*time.Second, "its device reported Healthy", func(p *corev1.Pod) bool {
		h, ok := health(p)
		return ok && h.Health == corev1.ResourceHealthStatusHealthy
	}); err != nil {
		t.Fatal(err)
	}

	writes := watchSliceWrites(t, r.n, gpuDriver)
	injected := time.Now()
	hwdraInject(t, r.mockDir, "xid", "--gpu", gpu, "--code", "79")
	pod, err := r.n.WaitPod(r.ctx, r.ns, "mig", 60*time.Second, "its device reported Unhealthy with XID 79", func(p *corev1.Pod) bool {
		h, ok := health(p)
		return ok && h.Health == corev1.ResourceHealthStatusUnhealthy && h.Message != nil && strings.Contains(*h.Message, "XID 79")
	})
	if err != nil {
		t.Fatal(err)
	}
	framework.Timing(t, "health-xid-to-pod-status", time.Since(injected))
	h, _ := health(pod)
	t.Logf("pod status: %s %s %q", h.ResourceID, h.Health, *h.Message)
	waitGPUTaints(t, r, gpu, "XID79")
	framework.Timing(t, "health-xid-to-taint-in-api", time.Since(injected))
	// The GPU's devices sit in one or two slices: only those are written.
	if n := writes(2); n < 1 {
		t.Errorf("%d ResourceSlice writes for one GPU's taint, want 1 or 2", n)
	} else {
		t.Logf("API WRITES health-xid-taint %d ResourceSlice writes", n)
	}

	recovered := time.Now()
	hwdraInject(t, r.mockDir, "clear", "--gpu", gpu)
	if _, err := r.n.WaitPod(r.ctx, r.ns, "mig", 60*time.Second, "its device Healthy again", func(p *corev1.Pod) bool {
		h, ok := health(p)
		return ok && h.Health == corev1.ResourceHealthStatusHealthy && h.Message == nil
	}); err != nil {
		t.Fatal(err)
	}
	waitGPUTaints(t, r, "", "")
	framework.Timing(t, "health-recovery-to-pod-status-and-api", time.Since(recovered))
	if n := writes(4); n < 2 {
		t.Errorf("%d ResourceSlice writes for one GPU's taint and its removal, want 2 to 4", n)
	} else {
		t.Logf("API WRITES health-xid-taint-and-recovery %d ResourceSlice writes", n)
	}
	r.deletePodAndCheck("mig", gpuDriver, "health-delete-to-unprepared", claim, before)
}

// watchSliceWrites counts the writes to a driver's ResourceSlices of the
// node, as the API server sees them, from now on.
func watchSliceWrites(t *testing.T, n *framework.Node, driver string) func(most int) int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sel := "spec.nodeName=" + n.Name + ",spec.driver=" + driver
	list, err := n.Admin.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	// From the list's version on: no synthetic events for what exists.
	w, err := n.Admin.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	var count atomic.Int64
	go func() {
		for range w.ResultChan() {
			count.Add(1)
		}
	}()
	return func(most int) int {
		// Writes still in flight arrive within a second: real time passes
		// to show no more than most come, watched throughout.
		waitfor.Never(t, fmt.Sprintf("more than %d ResourceSlice writes of %s", most, driver), time.Second, func() bool { return int(count.Load()) > most })
		return int(count.Load())
	}
}

// hwdraInject runs `hwdra mock inject --mock-dir DIR args...`.
func hwdraInject(t *testing.T, dir string, args ...string) {
	t.Helper()
	out, err := exec.Command(framework.HwdraBinary(t), append([]string{"mock", "inject", "--mock-dir", dir}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("hwdra mock inject %v: %v: %s", args, err, out)
	}
}

// waitGPUTaints waits until the GPU driver's slices in the API taint
// exactly the devices of GPU bus with value (bus "": no taint at all).
func waitGPUTaints(t *testing.T, r *hwRig, bus, value string) {
	t.Helper()
	var tainted int
	waitfor.NoError(t, fmt.Sprintf("slices in the API tainted as expected (GPU %q, %q)", bus, value), 60*time.Second, func() error {
		slices, err := r.n.WaitPoolsComplete(r.ctx, gpuDriver, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var bad string
		if bad, tainted = check(slices, bus, value); bad != "" || (bus != "" && tainted == 0) {
			return fmt.Errorf("%s (%d tainted)", bad, tainted)
		}
		return nil
	})
	t.Logf("slices in the API: %d devices of GPU %q tainted %s", tainted, bus, value)
}

func check(slices []resourceapi.ResourceSlice, bus, value string) (bad string, tainted int) {
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			onGPU := bus != "" && sliceAttr(&d, "resource.kubernetes.io/pciBusID") == bus
			ok := len(d.Taints) == 0
			if onGPU {
				ok = len(d.Taints) == 1 && d.Taints[0].Key == device.GPUTaintKey && d.Taints[0].Value == value &&
					d.Taints[0].Effect == resourceapi.DeviceTaintEffectNoSchedule && d.Taints[0].TimeAdded != nil
				tainted++
			}
			if !ok {
				return fmt.Sprintf("%s: taints %v", d.Name, d.Taints), 0
			}
		}
	}
	return "", tainted
}

// checkPodResources asks the kubelet's PodResources API (List) for the
// pod's resources: its container names the allocated device with our
// driver, pool and device name.
func checkPodResources(t *testing.T, n *framework.Node, ns, pod string, res resourceapi.DeviceRequestAllocationResult) {
	t.Helper()
	sock := filepath.Join(n.KubeletRoot(), "pod-resources", "kubelet.sock")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("PodResources List: %v", err)
	}
	var seen []string
	for _, p := range list.PodResources {
		if p.Namespace != ns || p.Name != pod {
			continue
		}
		for _, c := range p.Containers {
			for _, dr := range c.DynamicResources {
				for _, cr := range dr.ClaimResources {
					seen = append(seen, fmt.Sprintf("%s/%s/%s %v", cr.DriverName, cr.PoolName, cr.DeviceName, cr.CdiDevices))
					if cr.DriverName == res.Driver && cr.PoolName == res.Pool && cr.DeviceName == res.Device {
						t.Logf("PodResources List: container %s, claim %s: %s", c.Name, dr.ClaimName, seen[len(seen)-1])
						return
					}
				}
			}
		}
	}
	t.Fatalf("PodResources List does not name %s/%s/%s for pod %s/%s (it names %v)", res.Driver, res.Pool, res.Device, ns, pod, seen)
}
