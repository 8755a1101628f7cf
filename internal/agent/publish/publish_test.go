// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2/ktesting"

	"github.com/hwdra/hwdra/deploy"
	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/publish/publishtest"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/tools/allocate"
	"github.com/hwdra/hwdra/internal/waitfor"
)

const node = "worker-1"

// rig is a publisher on mock hardware against a fake API server.
type rig struct {
	t      *testing.T
	ctx    context.Context
	cancel context.CancelFunc
	client *fake.Clientset
	reg    *prometheus.Registry
	pub    *Publisher
}

// newRig makes a publisher of the hardware of a mock profile (YAML);
// opts may set the hooks. before registers API reactors first.
func newRig(t *testing.T, profile string, opts Options, before ...func(*fake.Clientset)) *rig {
	t.Helper()
	file := filepath.Join(t.TempDir(), "profile.yaml")
	if err := os.WriteFile(file, []byte(profile), 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := backend.Open("mock:" + file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	r := &rig{t: t, ctx: ctx, cancel: cancel, client: publishtest.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}}), reg: prometheus.NewRegistry()}
	for _, f := range before {
		f(r.client)
	}
	opts.NodeName, opts.Client, opts.Registry = node, r.client, r.reg
	if opts.Config == nil {
		opts.Config = config.Default()
	}
	if opts.Hardware == nil {
		opts.Hardware = n
	}
	r.pub = New(opts)
	t.Cleanup(r.pub.Stop)
	return r
}

// serve has the publisher serve drivers, probe and publish once, and
// run in the background, rescanning every 50 ms.
func (r *rig) serve(drivers ...string) {
	r.t.Helper()
	for _, d := range drivers {
		r.pub.Serve(d)
	}
	if !r.pub.Refresh(r.ctx) {
		r.t.Fatal("refresh: context ended")
	}
	if err := r.pub.Publish(r.ctx); err != nil {
		r.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.pub.Run(r.ctx, 50*time.Millisecond, nil)
	}()
	r.t.Cleanup(func() {
		r.cancel()
		<-done
	})
}

// pool waits until the driver's stored pool is complete and ok holds.
func (r *rig) pool(driver string, ok func([]*resourceapi.ResourceSlice) bool) []*resourceapi.ResourceSlice {
	r.t.Helper()
	return publishtest.WaitPool(r.t, r.client, driver, ok)
}

// verified waits until every served driver's publication is stored.
func (r *rig) verified() {
	r.t.Helper()
	waitfor.NoError(r.t, "publication verified", 30*time.Second, r.pub.Verified)
}

// rescans waits until Run has made n whole rescans after the call (n+1
// completed: one may have been under way), so that whatever they would
// hand to the API has been handed.
func (r *rig) rescans(n int) {
	r.t.Helper()
	count := func() float64 { v, _ := r.metric("hwdra_rescans_total", nil); return v }
	want := count() + float64(n+1)
	waitfor.True(r.t, fmt.Sprintf("%v rescans", want), 30*time.Second, func() bool { return count() >= want })
}

// metric is the value of a series of the publisher's metrics, and whether
// it exists.
func (r *rig) metric(name string, labels map[string]string) (float64, bool) {
	r.t.Helper()
	families, err := r.reg.Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue(), true
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true
			}
		}
	}
	return 0, false
}

func (r *rig) wantMetric(name string, labels map[string]string, want float64) {
	r.t.Helper()
	if got, ok := r.metric(name, labels); !ok || got != want {
		r.t.Errorf("%s%v = %v (present: %v), want %v", name, labels, got, ok, want)
	}
}

const twoGPUs = "gpus:\n- model: h100-80gb\n  count: 2\n"

func deviceKinds(ss []*resourceapi.ResourceSlice) map[string]int {
	out := map[string]int{}
	for _, s := range ss {
		for _, d := range s.Spec.Devices {
			out[*d.Attributes[device.AttrType].StringValue]++
		}
	}
	return out
}

// TestFallsBackWhenFieldsAreDropped: an API server without
// DRADeviceCompatibilityGroups drops the groups; the publisher notices
// (the controller's DroppedFieldsError) and republishes a model that needs
// none (no vGPU devices), instead of leaving MIG and vGPU of one GPU
// co-allocatable. Once the gate is on (the server keeps the groups) it
// finds out by a dry run and returns to the full model.
func TestFallsBackWhenFieldsAreDropped(t *testing.T) {
	var gateOn atomic.Bool
	strip := func(action k8stesting.Action) (bool, runtime.Object, error) {
		var obj runtime.Object
		// Creates and updates both carry the object.
		if act, ok := action.(interface{ GetObject() runtime.Object }); ok {
			obj = act.GetObject()
		}
		if s, ok := obj.(*resourceapi.ResourceSlice); ok && !gateOn.Load() {
			for i := range s.Spec.Devices {
				for j := range s.Spec.Devices[i].ConsumesCounters {
					s.Spec.Devices[i].ConsumesCounters[j].CompatibilityGroups = nil
				}
			}
		}
		return false, nil, nil
	}
	r := newRig(t, "gpus:\n- model: h100-80gb\n  count: 1\n  virtualization: host-vgpu\n", Options{RecheckFeatures: 200 * time.Millisecond},
		func(c *fake.Clientset) {
			c.PrependReactor("create", "resourceslices", strip)
			c.PrependReactor("update", "resourceslices", strip)
		})
	r.serve(device.GPUDriver)
	ss := r.pool(device.GPUDriver, func(ss []*resourceapi.ResourceSlice) bool {
		k := deviceKinds(ss)
		return k[device.KindVGPU] == 0 && k[device.KindMIG] > 0
	})
	if _, f := r.pub.Current(); f.CompatibilityGroups || !f.PartitionableDevices {
		t.Errorf("features in use after the drop: %+v", f)
	}
	// MIG partitions still allocate from the fallback model.
	classes, err := deploy.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	claim := &resourceapi.ResourceClaim{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
		allocate.Request("mig", "mig.gpu.hwdra.io", 1, `device.attributes["gpu.hwdra.io"].profile == "1g.10gb"`)}}}}
	if err := allocate.New(allocate.ClusterFeatures, node, ss, classes).Allocate(r.ctx, claim); err != nil {
		t.Fatalf("allocating a MIG partition from the fallback model: %v", err)
	}
	r.wantMetric("hwdra_feature_disabled", map[string]string{"feature": "DRADeviceCompatibilityGroups"}, 1)
	r.wantMetric("hwdra_feature_disabled", map[string]string{"feature": "DRADeviceTaints"}, 0)

	gateOn.Store(true)
	r.pool(device.GPUDriver, func(ss []*resourceapi.ResourceSlice) bool { return deviceKinds(ss)[device.KindVGPU] > 0 })
	if _, f := r.pub.Current(); f != device.AllFeatures {
		t.Errorf("features in use after the gate came back: %+v", f)
	}
	r.wantMetric("hwdra_feature_disabled", map[string]string{"feature": "DRADeviceCompatibilityGroups"}, 0)
}

// apiServerGate is the API server's rule for a gated field
// (k8s.io/kubernetes v1.37.2 pkg/registry/resource/resourceslice
// dropDisabledDRADeviceCompatibilityGroupsFields), for
// DRADeviceCompatibilityGroups: while the gate is off, a create drops
// every compatibility group; an update drops them unless the stored slice
// has one.
type apiServerGate struct {
	on     atomic.Bool
	client *fake.Clientset
}

func (g *apiServerGate) install(c *fake.Clientset) {
	g.client = c
	c.PrependReactor("create", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if s, ok := action.(k8stesting.CreateAction).GetObject().(*resourceapi.ResourceSlice); ok && !g.on.Load() {
			dropGroups(s)
		}
		return false, nil, nil
	})
	c.PrependReactor("update", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		s, ok := action.(k8stesting.UpdateAction).GetObject().(*resourceapi.ResourceSlice)
		if !ok || g.on.Load() {
			return false, nil, nil
		}
		old, err := c.Tracker().Get(resourceapi.SchemeGroupVersion.WithResource("resourceslices"), "", s.Name)
		if err != nil || !usesGroups(old.(*resourceapi.ResourceSlice)) {
			dropGroups(s)
		}
		return false, nil, nil
	})
}

func dropGroups(s *resourceapi.ResourceSlice) {
	for i := range s.Spec.Devices {
		for j := range s.Spec.Devices[i].ConsumesCounters {
			s.Spec.Devices[i].ConsumesCounters[j].CompatibilityGroups = nil
		}
	}
}

func usesGroups(s *resourceapi.ResourceSlice) bool {
	for _, d := range s.Spec.Devices {
		for _, c := range d.ConsumesCounters {
			if len(c.CompatibilityGroups) > 0 {
				return true
			}
		}
	}
	return false
}

// withoutGroups are the scheduler's features with
// DRADeviceCompatibilityGroups off.
func withoutGroups() structured.Features {
	f := allocate.ClusterFeatures
	f.CompatibilityGroups = false
	return f
}

// TestFallsBackWhenGateTurnsOffLater: slices with compatibility groups are
// stored while DRADeviceCompatibilityGroups is on; then the gate goes off
// (an API server and scheduler restarted). Updates keep the stored groups,
// so no write reports a dropped field, and a scheduler without the gate
// ignores every slice with groups: the pool is incomplete and nothing in
// it allocates. The periodic feature check (a dry-run create) finds the
// gate off, the publisher falls back to a model without groups, its
// update takes the groups out of the stored slices, and the scheduler
// allocates from the pool again. The check's one request per period is
// all it costs; the fallback says so in Degraded and the metric.
func TestFallsBackWhenGateTurnsOffLater(t *testing.T) {
	gate := &apiServerGate{}
	gate.on.Store(true)
	r := newRig(t, "gpus:\n- model: h100-80gb\n  count: 1\n  virtualization: host-vgpu\n", Options{RecheckFeatures: 300 * time.Millisecond}, gate.install)
	if err := r.pub.CheckFeatures(r.ctx); err != nil {
		t.Fatal(err)
	}
	r.serve(device.GPUDriver)
	ss := r.pool(device.GPUDriver, func(ss []*resourceapi.ResourceSlice) bool { return deviceKinds(ss)[device.KindVGPU] > 0 })
	if r.pub.Degraded() != nil {
		t.Errorf("Degraded with the gate on: %v", r.pub.Degraded())
	}
	classes, err := deploy.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	mig := func() *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			allocate.Request("mig", "mig.gpu.hwdra.io", 1, `device.attributes["gpu.hwdra.io"].profile == "1g.10gb"`)}}}}
	}
	// The scheduler's rule the fallback answers: with the gate off, the
	// slices with groups are skipped and the pool is incomplete.
	if err := allocate.New(withoutGroups(), node, ss, classes).Allocate(r.ctx, mig()); err == nil {
		t.Fatal("a scheduler without DRADeviceCompatibilityGroups allocated from slices with groups: the test shows nothing")
	}

	gate.on.Store(false)
	ss = r.pool(device.GPUDriver, func(ss []*resourceapi.ResourceSlice) bool {
		for _, s := range ss {
			if usesGroups(s) {
				return false
			}
		}
		return deviceKinds(ss)[device.KindVGPU] == 0 && deviceKinds(ss)[device.KindMIG] > 0
	})
	if _, f := r.pub.Current(); f.CompatibilityGroups {
		t.Errorf("features in use with the gate off: %+v", f)
	}
	if err := allocate.New(withoutGroups(), node, ss, classes).Allocate(r.ctx, mig()); err != nil {
		t.Errorf("a scheduler without DRADeviceCompatibilityGroups cannot allocate from the fallback model: %v", err)
	}
	if err := r.pub.Degraded(); err == nil || !strings.Contains(err.Error(), "DRADeviceCompatibilityGroups") || !strings.Contains(err.Error(), "no vGPU devices") {
		t.Errorf("Degraded = %v, want it to name the gate and what is left out", err)
	}
	r.wantMetric("hwdra_feature_disabled", map[string]string{"feature": "DRADeviceCompatibilityGroups"}, 1)
	r.wantMetric("hwdra_feature_disabled", map[string]string{"feature": "DRAPartitionableDevices"}, 0)
	// The check stores nothing.
	for _, s := range ss {
		if strings.Contains(s.Name, probeName) || strings.Contains(s.Spec.Pool.Name, probeName) {
			t.Errorf("the feature check's slice %s was stored", s.Name)
		}
	}
}

// TestFeatureCheckAtStart: the check before the first publication finds
// the gate off, so the first publication is already without groups (a
// restarted agent whose stored slices have them would otherwise keep them
// through updates). It asks with one dry-run create and writes nothing.
func TestFeatureCheckAtStart(t *testing.T) {
	gate := &apiServerGate{}
	r := newRig(t, "gpus:\n- model: h100-80gb\n  count: 1\n  virtualization: host-vgpu\n", Options{}, gate.install)
	r.pub.Serve(device.GPUDriver)
	if err := r.pub.CheckFeatures(r.ctx); err != nil {
		t.Fatal(err)
	}
	var creates, dryRuns int
	for _, a := range r.client.Actions() {
		if c, ok := a.(k8stesting.CreateActionImpl); ok && a.GetResource().Resource == "resourceslices" {
			creates++
			if len(c.CreateOptions.DryRun) > 0 {
				dryRuns++
			}
		}
	}
	if creates != 1 || dryRuns != 1 {
		t.Errorf("the check sent %d creates (%d dry runs), want one dry run", creates, dryRuns)
	}
	if _, f := r.pub.Current(); f != without(device.AllFeatures, []string{"DRADeviceCompatibilityGroups"}) {
		t.Errorf("features after the check: %+v", f)
	}
	r.serve()
	for _, s := range r.pool(device.GPUDriver, nil) {
		if usesGroups(s) {
			t.Errorf("slice %s published with groups after the check found the gate off", s.Name)
		}
	}
}

// TestFeatureCheckFails: an API server that cannot answer leaves the model
// as it is, and the error says what was asked.
func TestFeatureCheckFails(t *testing.T) {
	r := newRig(t, twoGPUs, Options{}, func(c *fake.Clientset) {
		c.PrependReactor("create", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("connection refused")
		})
	})
	r.pub.Serve(device.GPUDriver)
	err := r.pub.CheckFeatures(r.ctx)
	if err == nil || !strings.Contains(err.Error(), "dry-run create") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("CheckFeatures = %v", err)
	}
	if _, f := r.pub.Current(); f != device.AllFeatures || r.pub.Degraded() != nil {
		t.Errorf("a failed check changed the model: %+v, %v", f, r.pub.Degraded())
	}
}

// TestPublishesWhatChanged: the first publication and each change (a fault
// tainting a GPU's devices) are handed to the API once; a probe that finds
// nothing new writes nothing. What was published is counted by kind,
// looked up by KindOf, and told to the Published hook with the inventory
// it was built from.
func TestPublishesWhatChanged(t *testing.T) {
	var (
		mu        sync.Mutex
		faults    hw.Health
		published []string
		builtFrom hw.Inventory
	)
	r := newRig(t, twoGPUs, Options{Health: healthFuncs{
		faults: func() hw.Health { mu.Lock(); defer mu.Unlock(); return faults },
		published: func(driver string, res resourceslice.DriverResources, inv hw.Inventory, f device.Features) {
			mu.Lock()
			defer mu.Unlock()
			published = append(published, driver)
			builtFrom = inv
		},
	}})
	r.serve(device.GPUDriver)
	ss := r.pool(device.GPUDriver, nil)
	r.verified()
	gpu := device.GPUName("0000:1b:00.0")
	gpuLabels := map[string]string{"driver": device.GPUDriver}
	r.wantMetric("hwdra_resource_publications_total", gpuLabels, 1)
	r.wantMetric("hwdra_published_devices", map[string]string{"driver": device.GPUDriver, "kind": device.KindGPU}, 2)
	r.wantMetric("hwdra_published_devices", map[string]string{"driver": device.GPUDriver, "kind": device.KindMIG}, 40)
	// The controller counts a create once the call has returned, which
	// may be after the slice is in the store: wait for the count.
	creates := map[string]string{"driver": device.GPUDriver, "operation": "create"}
	waitfor.NoError(t, "slice creates counted", 10*time.Second, func() error {
		n, ok := r.metric("hwdra_resourceslice_writes_total", creates)
		if n > float64(len(ss)) {
			t.Fatalf("slice creates %v, want %d", n, len(ss))
		}
		if !ok || n != float64(len(ss)) {
			return fmt.Errorf("slice creates %v (present: %v), want %d", n, ok, len(ss))
		}
		return nil
	})
	if k := r.pub.KindOf(device.GPUDriver, gpu); k != device.KindGPU {
		t.Errorf("KindOf(%s) = %q", gpu, k)
	}
	if k := r.pub.KindOf(device.NICDriver, gpu); k != KindUnknown {
		t.Errorf("KindOf of a driver not published = %q", k)
	}
	mu.Lock()
	if len(published) != 1 || len(builtFrom.GPUs) != 2 {
		t.Errorf("Published hook: %v, built from %d GPUs", published, len(builtFrom.GPUs))
	}
	mu.Unlock()

	// Rescans of an unchanged node hand nothing to the API and write
	// nothing.
	writes := publishtest.Writes(r.client)
	r.rescans(3)
	if n := publishtest.Writes(r.client) - writes; n != 0 {
		t.Errorf("%d slice writes at rest", n)
	}
	r.wantMetric("hwdra_resource_publications_total", gpuLabels, 1)

	// A fault: the GPU's devices are published tainted, once.
	mu.Lock()
	faults = hw.Health{GPUs: map[string]hw.Fault{"0000:1b:00.0": {Reason: "XID79", Message: "fell off the bus", Fatal: true}}}
	mu.Unlock()
	r.pub.Poke()
	r.pool(device.GPUDriver, func(ss []*resourceapi.ResourceSlice) bool {
		for _, s := range ss {
			for _, d := range s.Spec.Devices {
				bus := *d.Attributes["resource.kubernetes.io/pciBusID"].StringValue
				tainted := len(d.Taints) == 1 && d.Taints[0].Key == device.GPUTaintKey && d.Taints[0].Value == "XID79"
				if tainted != (bus == "0000:1b:00.0") {
					return false
				}
			}
		}
		return true
	})
	r.verified()
	r.rescans(3)
	r.wantMetric("hwdra_resource_publications_total", gpuLabels, 2)
}

// TestProbesThroughUnclaimedViews: each probe goes through every driver's
// unclaimed view, then the Probed hook; Current is what came out.
func TestProbesThroughUnclaimedViews(t *testing.T) {
	r := newRig(t, twoGPUs, Options{Health: healthFuncs{
		// The health wiring's hold: here it marks what it saw.
		probed: func(inv hw.Inventory) hw.Inventory {
			inv.UnreadableGPUs = append(inv.UnreadableGPUs, hw.UnreadableGPU{Index: 9, Error: "seen"})
			return inv
		},
	}})
	first, _ := r.pub.Current()
	if len(first.GPUs) != 0 {
		t.Fatalf("Current before any probe: %d GPUs, want the Inventory option's (none)", len(first.GPUs))
	}
	probes := 0
	r.pub.AddUnclaimed(unclaimedFunc(func(probe func() (hw.Inventory, error)) (hw.Inventory, error) {
		probes++
		inv, err := probe()
		inv.GPUs = inv.GPUs[:1] // the other one is a claim's
		return inv, err
	}))
	if !r.pub.Refresh(r.ctx) {
		t.Fatal("refresh: context ended")
	}
	inv, f := r.pub.Current()
	if probes != 1 || len(inv.GPUs) != 1 || len(inv.UnreadableGPUs) != 1 || f != device.AllFeatures {
		t.Errorf("after a refresh: %d probes through the view, %d GPUs, %d marked by Probed, features %+v", probes, len(inv.GPUs), len(inv.UnreadableGPUs), f)
	}
}

// TestVerifiedFollowsTheAPIServer: a served driver is not ready until its
// publication is stored; failed writes (retried by the controller) keep it
// unready with the reason, until they succeed.
func TestVerifiedFollowsTheAPIServer(t *testing.T) {
	var failures atomic.Int32
	failures.Store(3)
	r := newRig(t, twoGPUs, Options{}, func(c *fake.Clientset) {
		c.PrependReactor("create", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
			if impl, ok := action.(k8stesting.CreateActionImpl); ok && len(impl.CreateOptions.DryRun) > 0 {
				return false, nil, nil
			}
			if failures.Add(-1) >= 0 {
				return true, nil, errors.New("etcd is having a bad day")
			}
			return false, nil, nil
		})
	})
	if err := r.pub.Verified(); err != nil {
		t.Errorf("Verified without a served driver: %v", err)
	}
	r.pub.Serve(device.GPUDriver)
	if err := r.pub.Verified(); err == nil || !strings.Contains(err.Error(), "gpu.hwdra.io: not published yet") {
		t.Errorf("Verified before publishing: %v", err)
	}
	r.serve()
	waitfor.True(t, "Verified naming the driver whose writes failed", 30*time.Second, func() bool {
		err := r.pub.Verified()
		return err != nil && strings.Contains(err.Error(), device.GPUDriver+": ")
	})
	r.verified()
	r.pool(device.GPUDriver, nil)
}

// TestSameSlices: what counts as the API server holding a publication.
func TestSameSlices(t *testing.T) {
	dev := func(name string, taints ...resourceapi.DeviceTaint) resourceapi.Device {
		return resourceapi.Device{Name: name, Taints: taints}
	}
	taint := resourceapi.DeviceTaint{Key: device.GPUTaintKey, Value: "XID79", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	want := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		node: {Slices: []resourceslice.Slice{{Devices: []resourceapi.Device{dev("a"), dev("b", taint)}}, {Devices: []resourceapi.Device{dev("c")}}}},
	}}
	stored := func(pool string, gen, count int64, devices ...resourceapi.Device) resourceapi.ResourceSlice {
		return resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{
			Pool: resourceapi.ResourcePool{Name: pool, Generation: gen, ResourceSliceCount: count}, Devices: devices}}
	}
	for _, tc := range []struct {
		name string
		have []resourceapi.ResourceSlice
		err  string // "": the same
	}{
		{"stored", []resourceapi.ResourceSlice{stored(node, 1, 2, dev("a"), dev("b", taint)), stored(node, 1, 2, dev("c"))}, ""},
		{"an older generation beside", []resourceapi.ResourceSlice{
			stored(node, 1, 1, dev("x")), stored(node, 2, 2, dev("a"), dev("b", taint)), stored(node, 2, 2, dev("c"))}, ""},
		{"nothing stored", nil, "pool worker-1 not stored"},
		{"incomplete", []resourceapi.ResourceSlice{stored(node, 1, 2, dev("a"), dev("b", taint))}, "generation 1 incomplete: 1 of 2 slices"},
		{"a device missing", []resourceapi.ResourceSlice{stored(node, 1, 2, dev("a"), dev("b", taint)), stored(node, 1, 2)}, "device c not stored"},
		{"a taint missing", []resourceapi.ResourceSlice{stored(node, 1, 2, dev("a"), dev("b")), stored(node, 1, 2, dev("c"))}, "device b stored with taints []"},
		{"a device more", []resourceapi.ResourceSlice{stored(node, 1, 2, dev("a"), dev("b", taint)), stored(node, 1, 2, dev("c"), dev("d"))}, "4 devices stored, 3 published"},
		{"a pool more", []resourceapi.ResourceSlice{
			stored(node, 1, 2, dev("a"), dev("b", taint)), stored(node, 1, 2, dev("c")), stored("old", 1, 1, dev("z"))}, "pool old is no longer published"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := sameSlices(want, tc.have)
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("want the same, got %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("got %v, want an error with %q", err, tc.err)
			}
		})
	}
	// An empty pool needs nothing stored.
	if err := sameSlices(resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: {}}}, nil); err != nil {
		t.Errorf("empty pool: %v", err)
	}
}

// TestFeatureFallbackOrder: which features a dropped gate turns off, and
// when a model is fuller than another.
func TestFeatureFallbackOrder(t *testing.T) {
	noGroups := without(device.AllFeatures, []string{"DRADeviceCompatibilityGroups", "DRAOptionalNodeOperations"})
	if noGroups.CompatibilityGroups || !noGroups.PartitionableDevices || !noGroups.ConsumableCapacity || !noGroups.DeviceTaints {
		t.Errorf("without compatibility groups: %+v", noGroups)
	}
	bare := without(device.AllFeatures, []string{"DRAPartitionableDevices", "DRADeviceCompatibilityGroups", "DRAConsumableCapacity", "DRADeviceTaints"})
	if bare != (device.Features{}) {
		t.Errorf("without every gate: %+v", bare)
	}
	for _, tc := range []struct {
		a, b device.Features
		want bool
	}{
		{device.AllFeatures, noGroups, true},
		{noGroups, device.AllFeatures, false},
		{noGroups, noGroups, false},
		{noGroups, bare, true},
		// Neither has all of the other's.
		{device.Features{DeviceTaints: true}, device.Features{ConsumableCapacity: true}, false},
	} {
		if got := more(tc.a, tc.b); got != tc.want {
			t.Errorf("more(%+v, %+v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
