// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/hwdra/hwdra/internal/agent/podnet/nritest"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/mock/fault"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// healthWatch is the kubelet's side of a driver's health stream: the
// latest report of every device.
type healthWatch struct {
	t  testing.TB
	mu sync.Mutex
	// devices: health and message by device name, as last reported.
	devices map[string]*drahealthv1.DeviceHealth
	reports int
	seen    chan struct{} // a report arrived
}

// watchHealth opens a driver's health stream as the kubelet does.
func (a *testAgent) watchHealth(driver string) *healthWatch {
	a.t.Helper()
	sock := filepath.Join(a.dir, "plugins", driver, "dra.sock")
	waitfor.True(a.t, "the plugin socket of "+driver, 30*time.Second, func() bool { _, err := os.Stat(sock); return err == nil })
	ctx, cancel := context.WithCancel(context.Background())
	a.t.Cleanup(cancel)
	stream, err := drahealthv1.NewDRAResourceHealthClient(a.dial(sock)).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		a.t.Fatal(err)
	}
	w := &healthWatch{t: a.t, devices: map[string]*drahealthv1.DeviceHealth{}, seen: make(chan struct{}, 1)}
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			w.mu.Lock()
			for _, d := range resp.Devices {
				if d.Device.PoolName != node {
					a.t.Errorf("health of a device in pool %q", d.Device.PoolName)
				}
				w.devices[d.Device.DeviceName] = d
			}
			w.reports++
			w.mu.Unlock()
			select {
			case w.seen <- struct{}{}:
			default:
			}
		}
	}()
	return w
}

// wait waits until cond holds for the devices reported so far.
func (w *healthWatch) wait(what string, cond func(map[string]*drahealthv1.DeviceHealth) bool) {
	w.t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		w.mu.Lock()
		ok := cond(w.devices)
		w.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-w.seen:
		case <-deadline:
			w.mu.Lock()
			defer w.mu.Unlock()
			var lines []string
			for name, d := range w.devices {
				if d.Health != drahealthv1.HealthStatus_HEALTHY {
					lines = append(lines, fmt.Sprintf("%s: %v %q", name, d.Health, d.Message))
				}
			}
			w.t.Fatalf("health stream: no %s within 30s (%d devices, not healthy: %v)", what, len(w.devices), lines)
		}
	}
}

// inject injects a fault into the agent's mock hardware, through its
// directory, as `hwdra mock inject` does.
func inject(t testing.TB, dir string, f fault.Fault) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fault.InjectDir(ctx, dir, f); err != nil {
		t.Fatal(err)
	}
}

// devicesOn maps the published devices of a GPU (by PCI address) to their
// taints, and reports the tainted devices elsewhere.
func taintsByGPU(ss []*resourceapi.ResourceSlice) map[string]map[string][]resourceapi.DeviceTaint {
	out := map[string]map[string][]resourceapi.DeviceTaint{}
	for _, s := range ss {
		for _, d := range s.Spec.Devices {
			bus := *d.Attributes["resource.kubernetes.io/pciBusID"].StringValue
			if out[bus] == nil {
				out[bus] = map[string][]resourceapi.DeviceTaint{}
			}
			out[bus][d.Name] = d.Taints
		}
	}
	return out
}

// onlyTainted reports whether exactly the devices of GPU bus carry a taint
// with this value (and nothing else is tainted).
func onlyTainted(ss []*resourceapi.ResourceSlice, bus, value string) bool {
	for gpu, devices := range taintsByGPU(ss) {
		for _, taints := range devices {
			want := gpu == bus
			got := len(taints) == 1 && taints[0].Key == device.GPUTaintKey && taints[0].Value == value
			if want != got || !want && len(taints) > 0 {
				return false
			}
		}
	}
	return true
}

func prepareClaims(t testing.TB, a *testAgent, driver string, claims ...*resourceapi.ResourceClaim) {
	t.Helper()
	dra := drapb.NewDRAPluginClient(a.dial(filepath.Join(a.dir, "plugins", driver, "dra.sock")))
	pb := claimsPB(claims)
	resp, err := dra.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: pb})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims {
		if r := resp.Claims[string(c.UID)]; r == nil || r.Error != "" {
			t.Fatalf("prepare %s: %+v", c.Name, r)
		}
	}
	// A share's MPS daemon outlives the agent by design: unprepared here,
	// before the agent stops (cleanups run last-in first-out), or it runs
	// on after the test. A test that stopped the agent itself unprepares
	// first (unprepareClaims).
	t.Cleanup(func() {
		if a.cancel != nil {
			unprepareClaims(t, a, driver, claims...)
		}
	})
}

// claimsPB names claims as the kubelet's DRA API does.
func claimsPB(claims []*resourceapi.ResourceClaim) []*drapb.Claim {
	pb := make([]*drapb.Claim, 0, len(claims))
	for _, c := range claims {
		pb = append(pb, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	return pb
}

// unprepareClaims unprepares claims through the driver's kubelet plugin
// (idempotent: claims unprepared before are no error).
func unprepareClaims(t testing.TB, a *testAgent, driver string, claims ...*resourceapi.ResourceClaim) {
	t.Helper()
	dra := drapb.NewDRAPluginClient(a.dial(filepath.Join(a.dir, "plugins", driver, "dra.sock")))
	pb := claimsPB(claims)
	resp, err := dra.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: pb})
	if err != nil {
		t.Errorf("unprepare: %v", err)
		return
	}
	for _, c := range claims {
		if r := resp.Claims[string(c.UID)]; r == nil || r.Error != "" {
			t.Errorf("unprepare %s: %+v", c.Name, r)
		}
	}
}

// migOn asks for a MIG partition of a profile at a placement of one GPU.
func migOn(profile, bus string, start int) resourceapi.DeviceRequest {
	r := migRequest(profile)
	r.Exactly.Selectors[0].CEL.Expression += fmt.Sprintf(` && device.attributes["resource.kubernetes.io"].pciBusID == %q && device.attributes["gpu.hwdra.io"].placementStart == %d`, bus, start)
	return r
}

// TestHealthXID: XID 79 on a GPU of a DGX H100 with two MIG partitions
// prepared reports the GPU, both partitions and every other device of that
// GPU Unhealthy on the kubelet's stream with the XID in the message, and
// the published slices taint exactly that GPU's devices. XID 13 (the
// application's) changes nothing. Once the GPU recovers, everything is
// Healthy and untainted again.
func TestHealthXID(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(persist.DirEnv, dir)
	a := startAgent(t, "mock:dgx-h100")
	const bus, other = "0000:1b:00.0", "0000:43:00.0"
	published := a.slices(device.GPUDriver, nil)
	// Placements chosen apart: each claim is allocated on its own.
	first := a.allocated(published, "mig-a", migOn("1g.10gb", bus, 0))
	second := a.allocated(published, "mig-b", migOn("3g.40gb", bus, 4))
	prepareClaims(t, a, device.GPUDriver, first, second)
	partitions := []string{first.Status.Allocation.Devices.Results[0].Device, second.Status.Allocation.Devices.Results[0].Device}

	w := a.watchHealth(device.GPUDriver)
	w.wait("full report", func(d map[string]*drahealthv1.DeviceHealth) bool {
		for _, p := range partitions {
			if d[p] == nil || d[p].Health != drahealthv1.HealthStatus_HEALTHY || d[p].HealthCheckTimeoutSeconds != int64(gpuHealthTimeout/time.Second) {
				return false
			}
		}
		return len(d) > 8
	})

	inject(t, dir, fault.Fault{Kind: fault.XID, GPU: bus, XID: 79})
	var onGPU []string
	for name, taints := range taintsByGPU(a.slices(device.GPUDriver, func(ss []*resourceapi.ResourceSlice) bool {
		return onlyTainted(ss, bus, "XID79")
	}))[bus] {
		onGPU = append(onGPU, name)
		if taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
			t.Errorf("%s: effect %s without fatalEffect configured", name, taints[0].Effect)
		}
	}
	w.wait("every device of the GPU Unhealthy with the XID", func(d map[string]*drahealthv1.DeviceHealth) bool {
		for _, name := range append(onGPU, partitions...) {
			if d[name] == nil || d[name].Health != drahealthv1.HealthStatus_UNHEALTHY || !strings.Contains(d[name].Message, "XID 79 (GPU has fallen off the bus)") {
				return false
			}
		}
		for name, h := range d {
			if strings.HasPrefix(name, device.GPUName(other)) && h.Health != drahealthv1.HealthStatus_HEALTHY {
				t.Fatalf("%s of another GPU: %v %q", name, h.Health, h.Message)
			}
		}
		return true
	})
	t.Logf("XID 79: %d devices of %s tainted and Unhealthy, partitions %v", len(onGPU), bus, partitions)

	// The taint's writes may still be in flight (a multi-slice pool):
	// count from when they stop.
	writes, publications := a.quietWrites(), a.publications()
	w.mu.Lock()
	reports := w.reports
	w.mu.Unlock()
	events := a.counter("hwdra_gpu_health_events_total")
	inject(t, dir, fault.Fault{Kind: fault.XID, GPU: other, XID: 13})
	// The monitor judged the XID (and told a change, had it made one),
	// then the publisher rescanned twice.
	waitfor.True(t, "the GPU monitor's judgement of XID 13", 30*time.Second, func() bool { return a.counter("hwdra_gpu_health_events_total") > events })
	a.settle()
	if p := a.publications(); p != publications {
		t.Errorf("XID 13 was published %v times", p-publications)
	}
	for d := range deviceNames(a.slices(device.GPUDriver, nil)) {
		if strings.HasPrefix(d, device.GPUName(other)) {
			if got := a.metric(fmt.Sprintf(`hwdra_device_health_state{device=%q,driver="gpu.hwdra.io",pool=%q,state="Healthy"}`, d, node)); got != "1" {
				t.Errorf("after XID 13: %s Healthy %q", d, got)
			}
		}
	}
	w.mu.Lock()
	for name, h := range w.devices {
		if strings.HasPrefix(name, device.GPUName(other)) && h.Health != drahealthv1.HealthStatus_HEALTHY {
			t.Errorf("after XID 13: %s %v", name, h.Health)
		}
	}
	if w.reports != reports {
		t.Errorf("XID 13 sent %d reports", w.reports-reports)
	}
	w.mu.Unlock()
	if n := a.writes(); n != writes {
		t.Errorf("XID 13 made %d slice writes", n-writes)
	}

	inject(t, dir, fault.Fault{Kind: fault.Clear, GPU: bus})
	recovered := deviceNames(a.slices(device.GPUDriver, func(ss []*resourceapi.ResourceSlice) bool { return onlyTainted(ss, "", "") }))
	w.wait("recovery", func(d map[string]*drahealthv1.DeviceHealth) bool {
		for name := range recovered {
			if h := d[name]; h == nil || h.Health != drahealthv1.HealthStatus_HEALTHY || h.Message != "" {
				return false
			}
		}
		return true
	})
}

// TestHealthGPULost: a GPU lost from the bus stays published, tainted
// GPULost (NoExecute, as configured for fatal faults), its devices
// Unhealthy; the other seven stay published, untainted, and a claim lands
// on one of them and prepares.
func TestHealthGPULost(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(persist.DirEnv, dir)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\nhealth: {fatalEffect: NoExecute}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startAgentWith(t, Options{Hardware: "mock:dgx-h100", ConfigPath: cfg})
	const bus = "0000:1b:00.0"
	a.slices(device.GPUDriver, nil)
	w := a.watchHealth(device.GPUDriver)
	inject(t, dir, fault.Fault{Kind: fault.GPULost, GPU: bus})
	ss := a.slices(device.GPUDriver, func(ss []*resourceapi.ResourceSlice) bool {
		byGPU := taintsByGPU(ss)
		if len(byGPU) != 8 {
			return false
		}
		for _, taints := range byGPU[bus] {
			if len(taints) != 1 || taints[0].Value != "GPULost" || taints[0].Effect != resourceapi.DeviceTaintEffectNoExecute {
				return false
			}
		}
		return true
	})
	if !onlyTainted(ss, bus, "GPULost") {
		t.Fatal("devices of other GPUs tainted")
	}
	w.wait("the lost GPU Unhealthy", func(d map[string]*drahealthv1.DeviceHealth) bool {
		h := d[device.GPUName(bus)]
		return h != nil && h.Health == drahealthv1.HealthStatus_UNHEALTHY && strings.Contains(h.Message, "fallen off the bus")
	})
	claim := a.allocated(ss, "whole", resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "gpu.hwdra.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}})
	if dev := claim.Status.Allocation.Devices.Results[0].Device; dev == device.GPUName(bus) {
		t.Fatalf("the scheduler's allocator chose the lost GPU %s", dev)
	}
	prepareClaims(t, a, device.GPUDriver, claim)
}

// TestHealthNVMLLate: NVML missing when the agent starts (the driver not
// loaded yet): the NIC driver serves, the GPU driver starts once the
// driver is loaded, without an agent restart.
func TestHealthNVMLLate(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(persist.DirEnv, dir)
	h := mocktest.Open(t, "dgx-h100")
	if err := h.SetDriverLoaded(false); err != nil {
		t.Fatal(err)
	}
	h.Close()
	a := startAgent(t, "mock:dgx-h100")
	a.slices(device.NICDriver, nil)
	gpuSock := filepath.Join(a.dir, "plugins", device.GPUDriver, "dra.sock")
	if _, err := os.Stat(gpuSock); err == nil {
		t.Fatal("GPU plugin serving without NVML")
	}
	inject(t, dir, fault.Fault{Kind: fault.Driver, Up: true})
	ss := a.slices(device.GPUDriver, func(ss []*resourceapi.ResourceSlice) bool { return len(taintsByGPU(ss)) == 8 })
	a.watchHealth(device.GPUDriver).wait("GPU health", func(d map[string]*drahealthv1.DeviceHealth) bool {
		return d[device.GPUName("0000:1b:00.0")] != nil
	})
	prepareClaims(t, a, device.GPUDriver, a.allocated(ss, "mig", migRequest("1g.10gb")))
}

// TestHealthLinkDown: as root on veth stand-ins, a PF's link going down
// (its veth losing carrier) reports its shared device Unhealthy and
// publishes it tainted LinkDown, still allocatable to a tolerating claim;
// link up restores it.
func TestHealthLinkDown(t *testing.T) {
	nritest.HostNetns(t)
	dir := t.TempDir()
	t.Setenv(persist.DirEnv, dir)
	a := startAgent(t, "mock:cx7")
	const pf = "0000:17:00.0"
	shared := device.NICDeviceName(pf)
	a.slices(device.NICDriver, nil)
	w := a.watchHealth(device.NICDriver)
	w.wait("both PFs", func(d map[string]*drahealthv1.DeviceHealth) bool {
		return len(d) == 2 && d[shared].HealthCheckTimeoutSeconds == int64(nicHealthTimeout/time.Second)
	})
	tainted := func(value string) func([]*resourceapi.ResourceSlice) bool {
		return func(ss []*resourceapi.ResourceSlice) bool {
			for _, s := range ss {
				for _, d := range s.Spec.Devices {
					got := len(d.Taints) == 1 && d.Taints[0].Key == device.NICTaintKey && d.Taints[0].Value == value
					if (d.Name == shared && value != "") != got {
						return false
					}
				}
			}
			return len(deviceNames(ss)) == 2
		}
	}
	inject(t, dir, fault.Fault{Kind: fault.Link, PF: pf})
	w.wait("the shared device Unhealthy", func(d map[string]*drahealthv1.DeviceHealth) bool {
		return d[shared].Health == drahealthv1.HealthStatus_UNHEALTHY && strings.Contains(d[shared].Message, "link is down")
	})
	a.slices(device.NICDriver, tainted("LinkDown"))
	inject(t, dir, fault.Fault{Kind: fault.Link, PF: pf, Up: true})
	w.wait("the shared device Healthy", func(d map[string]*drahealthv1.DeviceHealth) bool {
		return d[shared].Health == drahealthv1.HealthStatus_HEALTHY
	})
	ss := a.slices(device.NICDriver, tainted(""))
	for _, s := range ss {
		for _, d := range s.Spec.Devices {
			if bw := d.Capacity[device.NICCapBandwidth].Value; d.Name == shared && bw.String() != "400G" {
				t.Errorf("bandwidth after the link came back: %v", bw.String())
			}
		}
	}
}

// TestHealthTaintDespiteAPIErrors: the API server refusing the slice
// writes that carry a taint does not lose it: the writes are retried with
// backoff until the taint is in the API.
func TestHealthTaintDespiteAPIErrors(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(persist.DirEnv, dir)
	var failing atomic.Int32
	a := startAgent(t, "gpus: [{model: h100-80gb, count: 2}]\n", func(c *fake.Clientset) {
		refuse := func(k8stesting.Action) (bool, runtime.Object, error) {
			if failing.Load() > 0 {
				failing.Add(-1)
				return true, nil, apierrors.NewServiceUnavailable("etcd is having a bad day")
			}
			return false, nil, nil
		}
		for _, verb := range []string{"create", "update", "delete"} {
			c.PrependReactor(verb, "resourceslices", refuse)
		}
	})
	a.slices(device.GPUDriver, nil)
	failing.Store(4)
	inject(t, dir, fault.Fault{Kind: fault.XID, GPU: "0000:1b:00.0", XID: 48})
	a.slices(device.GPUDriver, func(ss []*resourceapi.ResourceSlice) bool { return onlyTainted(ss, "0000:1b:00.0", "XID48") })
	if n := failing.Load(); n != 0 {
		t.Fatalf("%d refusals left: the taint was written without them", n)
	}
}
