// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/hwdra/hwdra/deploy"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/tools/allocate"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// fleetParams are a run's settings.
type fleetParams struct {
	nodes, pods int
	bad         string // a badClaims key, or none
	limits      bool   // the chart's claim-limits policy installed
	timeout     time.Duration
	scheduler   fleetScheduler
	shares      int    // claims allocated before the scheduler starts (fleet_shares_test.go)
	percentage  int    // the scheduler's percentageOfNodesToScore (0: its default)
	profile     string // a directory for the scheduler's CPU profiles, per kind ("": none)
}

// fleetScheduler is a kube-scheduler binary to run ("" the built one).
type fleetScheduler struct{ name, binary string }

// fleetRun is what one run measured.
type fleetRun struct {
	nodes, pods int
	fill        string  // what the shares fill allocated
	slices      int     // ResourceSlice objects
	sliceBytes  int     // their JSON
	watchEvents float64 // the API server's ResourceSlice watch events
	watchBytes  float64
	total       time.Duration // scheduler start to the last good pod bound
	cpu         time.Duration // the scheduler's CPU until then
	kinds       map[string]kindResult
	badAttempts float64 // the scheduler's unschedulable attempts
	badEvents   int32   // the bad pod's FailedScheduling events, counted
	badRefused  string  // the claim-limits policy's refusal of the bad claim, if it refused it
}

// kindResult: a kind's pods are scheduled in turn after the previous
// kind's (createPriorityClasses), so its window runs from the previous
// kind's last bind to its own last.
type kindResult struct {
	pods      int           // bound
	unbound   int           // left pending when the run ended
	rate      float64       // pods/s in its window
	cpuPerPod time.Duration // the scheduler's CPU in its window, per pod
	p50, p99  time.Duration // time to bind, from the scheduler's start
}

// bind is a pod's binding as the test saw it, with the scheduler's CPU
// time then.
type bind struct {
	at  time.Duration // since the scheduler started
	cpu time.Duration
}

// runFleet starts a control plane, registers nodes Nodes publishing model's
// slices, creates pods pods (and first a pod with badClaims[bad], if bad is
// set), starts the scheduler and measures until every other pod is bound.
//
// With limits the chart's claim-limits admission policy is installed, as
// on an operator's cluster: a bad claim it refuses never exists.
func runFleet(t *testing.T, model fleetModel, p fleetParams, invs inventories) fleetRun {
	ctx := context.Background()
	nodes, pods, bad, limits, timeout := p.nodes, p.pods, p.bad, p.limits, p.timeout
	n := framework.New(t, framework.Options{ControlPlaneOnly: true, DeferScheduler: true, SkipDeploy: true,
		SchedulerBinary: p.scheduler.binary, PercentageOfNodesToScore: p.percentage, SchedulerProfiling: p.profile != ""})
	cs, err := n.FastAdmin()
	if err != nil {
		t.Fatal(err)
	}
	classes, err := deploy.DeviceClasses()
	if err != nil {
		t.Fatal(err)
	}
	if model.classes != nil {
		classes = model.classes(classes)
	}
	for _, c := range classes {
		if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := createPriorityClasses(ctx, cs); err != nil {
		t.Fatal(err)
	}
	if limits {
		installClaimLimits(ctx, t, n)
	}
	before, err := n.APIServerMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := fleetRun{nodes: nodes, kinds: map[string]kindResult{}}
	var mu sync.Mutex
	targets := map[string][]fillTarget{}
	began := time.Now()
	err = parallel(nodes, func(i int) error {
		name := fmt.Sprintf("fleet-%05d", i)
		if err := framework.RegisterNode(ctx, cs, name); err != nil {
			return err
		}
		slices := model.slices(name, invs.get(t, fleetHardware(i)))
		if p.shares > 0 {
			mu.Lock()
			targets[name] = fillTargets(name, slices)
			mu.Unlock()
		}
		for _, s := range slices {
			if _, err := cs.ResourceV1().ResourceSlices().Create(ctx, &s, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("slice %s: %w", s.Name, err)
			}
			mu.Lock()
			r.slices, r.sliceBytes = r.slices+1, r.sliceBytes+jsonSize(&s)
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d nodes, %d slices in %v", model.name, nodes, r.slices, time.Since(began).Round(time.Millisecond))

	if p.shares > 0 {
		r.fill = fillFleet(ctx, t, n, cs, model, targets, p)
	}
	ns := n.CreateNamespace(t, "fleet")
	names := map[string][]string{} // kind -> its pods
	type job struct {
		name string
		kind int
	}
	var jobs []job
	for k, kind := range fleetKinds {
		count := pods / len(fleetKinds)
		if k < pods%len(fleetKinds) {
			count++
		}
		for j := range count {
			name := fmt.Sprintf("k%d-%s-%05d", k, strings.ReplaceAll(kind.name, ".", "-"), j) // a DNS label
			names[kind.name] = append(names[kind.name], name)
			jobs = append(jobs, job{name, k})
		}
	}
	r.pods = len(jobs)
	if bad != "" { // created first, the queue's head
		err := createPod(ctx, cs, ns, "a-bad", "fleet-bad", "", badClaims[bad])
		switch {
		case err != nil && limits && strings.Contains(err.Error(), "claimLimits.gpusPerNode"):
			r.badRefused = err.Error()
			bad = "" // never reaches the scheduler
		case err != nil:
			t.Fatal(err)
		}
	}
	began = time.Now()
	err = parallel(len(jobs), func(i int) error {
		kind := fleetKinds[jobs[i].kind]
		reqs := kind.ours
		if model.name == oneDeviceModel.name {
			reqs = kind.one
		}
		gate := ""
		if jobs[i].kind > 0 {
			gate = kindGate(jobs[i].kind)
		}
		return createPod(ctx, cs, ns, jobs[i].name, kindPriority(jobs[i].kind), gate, reqs)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d pods and their claims in %v", model.name, len(jobs), time.Since(began).Round(time.Millisecond))

	stop := make(chan struct{})
	defer close(stop)
	b := watchBinds(t, n, ns, stop)
	if p.profile != "" {
		b.profile = func(kind string) func() {
			return profileScheduler(t, filepath.Join(p.profile, fmt.Sprintf("%s-%s-%s", p.scheduler.name, model.name, kind)))
		}
	}
	b.started(time.Now())
	if err := n.StartScheduler(ctx); err != nil {
		t.Fatal(err)
	}
	b.scheduleKinds(t, model.name, names, timeout, func(pods []string) error { return ungate(ctx, cs, ns, pods) },
		func() string { return whyPending(ctx, n, ns) })
	fillKinds(&r, b.snapshot(), b.origins, names)
	if model.name != oneDeviceModel.name {
		t.Logf("fleet vgpu-hosts %s: vgpu pods left pending %d; %s", model.name, r.kinds["vgpu"].unbound, vgpuHostGPUs(ctx, t, n, ns, nodes, invs))
	}

	after, err := n.APIServerMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.watchEvents = watchMetric(after, "apiserver_watch_events_total") - watchMetric(before, "apiserver_watch_events_total")
	r.watchBytes = watchMetric(after, "apiserver_watch_events_sizes_sum") - watchMetric(before, "apiserver_watch_events_sizes_sum")
	if bad != "" {
		sched, err := framework.SchedulerMetrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r.badAttempts = framework.MetricSum(sched, "scheduler_schedule_attempts_total", "result=unschedulable") +
			framework.MetricSum(sched, "scheduler_schedule_attempts_total", "result=error")
		r.badEvents = failedScheduling(ctx, t, n, ns, "a-bad")
	}
	return r
}

// installClaimLimits applies the chart's claim-limits policy and its
// binding (deploy/hwdra.yaml: the chart with its defaults, 8 GPUs per
// node) and waits until a claim it refuses is refused.
func installClaimLimits(ctx context.Context, t *testing.T, n *framework.Node) {
	t.Helper()
	dir, err := framework.DeployDir()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "hwdra.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := framework.ReadObjects(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var policy []*unstructured.Unstructured
	for _, o := range objs {
		if strings.HasSuffix(o.GetName(), "-claim-limits") {
			policy = append(policy, o)
		}
	}
	if len(policy) != 2 {
		t.Fatalf("deploy/hwdra.yaml: %d claim-limits objects, want the policy and its binding", len(policy))
	}
	if _, err := framework.Apply(ctx, n.AdminConfig, "", policy...); err != nil {
		t.Fatal(err)
	}
	// A policy takes effect once the API server has compiled it.
	probe := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "limits-probe", Namespace: "default"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			allocate.Request("dev", "gpu.hwdra.io", 99, ""),
		}}}}
	waitfor.NoError(t, "the claim-limits policy in force", 30*time.Second, func() error {
		_, err := n.Admin.ResourceV1().ResourceClaims("default").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), "claimLimits.gpusPerNode") {
			return nil
		}
		return fmt.Errorf("a claim for 99 GPUs is not refused by the policy: %v", err)
	})
}

// watchMetric sums a watch metric's ResourceSlice samples (the label is
// kind=ResourceSlice or resource=resourceslices, by version).
func watchMetric(text, name string) float64 {
	return framework.MetricSum(text, name, "kind=ResourceSlice") + framework.MetricSum(text, name, "resource=resourceslices")
}

// binds records every pod's binding: when (since the scheduler started)
// and the scheduler's CPU time then.
type binds struct {
	mu    sync.Mutex
	start time.Time
	sched *framework.Process
	got   map[string]bind
	// changed is told of each bind; origins are where each kind after
	// the first was ungated (scheduleKinds).
	changed chan struct{}
	origins map[string]bind
	// profile, if set, starts profiling the scheduler for a kind; the
	// function it returns stops it.
	profile func(kind string) func()
}

// watchBinds watches ns's pods until stop closes.
func watchBinds(t *testing.T, n *framework.Node, ns string, stop <-chan struct{}) *binds {
	b := &binds{sched: n.Scheduler, got: map[string]bind{},
		changed: make(chan struct{}, 1), origins: map[string]bind{}}
	f := informers.NewSharedInformerFactoryWithOptions(n.Admin, 0, informers.WithNamespace(ns))
	_, err := f.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
				b.bound(p.Name)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	f.Start(stop)
	f.WaitForCacheSync(stop)
	return b
}

func (b *binds) bound(name string) {
	cpu, _ := b.sched.CPUTime()
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, seen := b.got[name]; seen || b.start.IsZero() {
		return
	}
	b.got[name] = bind{at: time.Since(b.start), cpu: cpu}
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

func (b *binds) started(at time.Time) {
	b.mu.Lock()
	b.start = at
	b.mu.Unlock()
}

// scheduleKinds lets the scheduler at one kind at a time, in fleetKinds'
// order (the first is not gated): each next kind is ungated once every
// pod of the one before is bound, or none of its pods was bound for a
// minute (left pending: refused everywhere). Until timeout in all: a run
// that leaves pods pending fails, but still gives its figures.
func (b *binds) scheduleKinds(t *testing.T, model string, names map[string][]string, timeout time.Duration,
	ungate func([]string) error, why func() string) {
	deadline := time.After(timeout)
	for k, kind := range fleetKinds {
		if k > 0 {
			cpu, _ := b.sched.CPUTime()
			b.mu.Lock()
			b.origins[kind.name] = bind{at: time.Since(b.start), cpu: cpu}
			b.mu.Unlock()
			if err := ungate(names[kind.name]); err != nil {
				t.Fatalf("%s: ungating the %s pods: %v", model, kind.name, err)
			}
		}
		stop := func() {}
		if b.profile != nil {
			stop = b.profile(kind.name)
		}
		done := b.waitKind(t, model, kind.name, names[kind.name], deadline, why)
		stop()
		if !done {
			return
		}
	}
}

// waitKind waits until pods are bound, none of them was for a minute
// (true: go on with the next kind), or the deadline (false).
func (b *binds) waitKind(t *testing.T, model, kind string, pods []string, deadline <-chan time.Time, why func() string) bool {
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	bound, lastBind := 0, time.Now()
	for {
		got := b.count(pods)
		if got == len(pods) {
			return true
		}
		if got != bound {
			bound, lastBind = got, time.Now()
		}
		select {
		case <-b.changed:
		case <-deadline:
			t.Errorf("%s: %s: %d of %d pods bound when the run's time was up; %s", model, kind, got, len(pods), why())
			return false
		case <-tick.C:
			if time.Since(lastBind) > time.Minute {
				t.Errorf("%s: %s: %d of %d pods bound, none for a minute; %s", model, kind, got, len(pods), why())
				return true
			}
		}
	}
}

// profileScheduler takes the scheduler's CPU profile in 5 s pieces,
// prefix-N.pprof (go tool pprof merges them), until the function it
// returns is called; that waits for the piece under way.
func profileScheduler(t *testing.T, prefix string) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			f, err := os.Create(fmt.Sprintf("%s-%d.pprof", prefix, i))
			if err != nil {
				t.Errorf("scheduler profile: %v", err)
				return
			}
			err = framework.SchedulerCPUProfile(context.Background(), 5, f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Errorf("scheduler profile %s: %v", f.Name(), err)
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}

// count is how many of pods are bound.
func (b *binds) count(pods []string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, p := range pods {
		if _, ok := b.got[p]; ok {
			n++
		}
	}
	return n
}

func (b *binds) snapshot() map[string]bind {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.got)
}

// fillKinds computes each kind's figures from the binds; kinds are
// scheduled one after another in fleetKinds' order (scheduleKinds), each
// window from the kind's ungating (origins) to its last bind. The first
// kind's window starts at its first bind, not at the scheduler's start
// (which includes its informers' sync), and so counts one pod less.
func fillKinds(r *fleetRun, got, origins map[string]bind, names map[string][]string) {
	for _, kind := range fleetKinds {
		var ats []time.Duration
		first, last := bind{at: time.Duration(1 << 62)}, bind{}
		unbound := 0
		for _, name := range names[kind.name] {
			b, ok := got[name]
			if !ok {
				unbound++
				continue
			}
			ats = append(ats, b.at)
			if b.at < first.at {
				first = b
			}
			if b.at > last.at {
				last = b
			}
		}
		if len(ats) == 0 {
			r.kinds[kind.name] = kindResult{unbound: unbound}
			continue
		}
		origin, count := first, len(ats)-1
		if o, ok := origins[kind.name]; ok {
			origin, count = o, len(ats)
		}
		k := kindResult{pods: len(ats), unbound: unbound, p50: percentile(ats, 0.5), p99: percentile(ats, 0.99)}
		if window := last.at - origin.at; window > 0 && count > 0 {
			k.rate = float64(count) / window.Seconds()
			k.cpuPerPod = (last.cpu - origin.cpu) / time.Duration(count)
		}
		r.kinds[kind.name] = k
		if last.at > r.total {
			r.total, r.cpu = last.at, last.cpu
		}
	}
}

// failedScheduling counts the scheduler's FailedScheduling events of a pod
// (the recorder folds repeats into one event's count).
func failedScheduling(ctx context.Context, t *testing.T, n *framework.Node, ns, pod string) int32 {
	evs, err := n.Admin.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err != nil {
		t.Fatal(err)
	}
	var count int32
	for _, e := range evs.Items {
		if e.Reason != "FailedScheduling" {
			continue
		}
		switch {
		case e.Series != nil:
			count += e.Series.Count
		case e.Count > 0:
			count += e.Count
		default:
			count++
		}
	}
	return count
}

// whyPending says what the scheduler said of a pod still unbound.
func whyPending(ctx context.Context, n *framework.Node, ns string) string {
	pods, err := n.Admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName="})
	if err != nil || len(pods.Items) == 0 {
		return fmt.Sprintf("no pod pending (%v)", err)
	}
	p := pods.Items[len(pods.Items)-1]
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return fmt.Sprintf("%d pending, e.g. %s: %s: %s", len(pods.Items), p.Name, c.Reason, c.Message)
		}
	}
	return fmt.Sprintf("%d pending, e.g. %s: never tried", len(pods.Items), p.Name)
}

// vgpuHostGPUs says how the vGPU hosts' GPUs are used when the run ends.
// A GPU holding a container's MIG partition can hold no time-sliced vGPU
// (their compatibility groups differ: the GPU runs one mode), so MIG pods
// the scheduler places on a vGPU host take that GPU's vGPUs away.
func vgpuHostGPUs(ctx context.Context, t *testing.T, n *framework.Node, ns string, nodes int, invs inventories) string {
	hosts := map[string]bool{}
	for i := range nodes {
		if fleetHardware(i) == "mock:h100-vgpu" {
			hosts[fmt.Sprintf("fleet-%05d", i)] = true
		}
	}
	claims, err := n.Admin.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Sprintf("vGPU hosts: listing claims: %v", err)
	}
	gpusOfHost := invs.get(t, "mock:h100-vgpu").GPUs
	mig, vgpu := map[string]bool{}, map[string]bool{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, res := range c.Status.Allocation.Devices.Results {
			if !hosts[res.Pool] {
				continue
			}
			for _, g := range gpusOfHost {
				kind, ok := strings.CutPrefix(res.Device, device.GPUName(g.PCIBusID)+"-")
				switch {
				case !ok:
				case strings.HasPrefix(kind, "vgpu-"):
					vgpu[res.Pool+"/"+g.PCIBusID] = true
				default:
					mig[res.Pool+"/"+g.PCIBusID] = true
				}
			}
		}
	}
	gpus := len(hosts) * len(gpusOfHost)
	return fmt.Sprintf("vGPU hosts: %d with %d GPUs; %d hold containers' MIG partitions (no time-sliced vGPU fits there), %d hold vGPUs, %d hold nothing",
		len(hosts), gpus, len(mig), len(vgpu), gpus-len(mig)-len(vgpu))
}
