// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podnet

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/podnet/nritest"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/agent/prepare/nic"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
	"github.com/hwdra/hwdra/internal/tools/allocate"
	"github.com/hwdra/hwdra/internal/waitfor"
)

const (
	testNode = "worker-1"
	testBoot = "boot-1"
)

// env is a mock node whose netdevs are veth stand-ins in a throwaway
// "host" namespace, the real NIC driver and prepare plugin over it, the
// NRI plugin, and NRI's runtime side (pkg/adaptation, what containerd
// embeds) in process, talking to the plugin over a real socket.
type env struct {
	t      *testing.T
	ctx    context.Context
	hw     *mock.Hardware
	host   string // the host namespace's path
	dir    string
	alloc  *allocate.Allocator
	nic    *prepare.Plugin[nic.Record]
	net    *Plugin
	meta   *fakeMetadata
	client *fake.Clientset
	status *metadata.StatusWriter
	sock   string
	// returnWait is the plugin's ReturnWait (0: its default).
	returnWait time.Duration

	rt      *nritest.Runtime
	stopRun context.CancelFunc
	runDone chan struct{}

	mu     sync.Mutex
	events []string                      // "<pod> <type> <reason>: <note>", as recorded
	pods   map[types.UID]*api.PodSandbox // running, as the runtime lists them
	netns  map[string]func() error       // pod namespaces' removers
	uses   map[types.UID][]string        // the claims each pod names (ClaimsOf)
}

// ClaimsOf is the plugin's Pods: the claim names env.uses has.
func (e *env) ClaimsOf(_, _ string, uid types.UID) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.uses[uid]
}

// Eventf is the plugin's Events: it keeps them for the test.
func (e *env) Eventf(regarding, _ runtime.Object, eventtype, reason, _, note string, args ...interface{}) {
	ref, _ := regarding.(*corev1.ObjectReference)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, fmt.Sprintf("%s/%s %s %s: %s", ref.Namespace, ref.Name, eventtype, reason, fmt.Sprintf(note, args...)))
}

// recorded are the Events so far.
func (e *env) recorded() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.events...)
}

// removeNetns deletes a pod's network namespace.
func (e *env) removeNetns(sb *api.PodSandbox) {
	e.t.Helper()
	e.mu.Lock()
	remove := e.netns[netnsPath(sb)]
	e.mu.Unlock()
	if err := remove(); err != nil {
		e.t.Fatal(err)
	}
}

// newEnv needs root: namespaces and veths.
func newEnv(t *testing.T, profile string) *env {
	t.Helper()
	return newEnvReturnWait(t, profile, 0)
}

// newEnvReturnWait is newEnv whose plugin waits up to returnWait for a
// VF to return from a namespace that is gone (0: the plugin's default).
func newEnvReturnWait(t *testing.T, profile string, returnWait time.Duration) *env {
	t.Helper()
	host := nritest.HostNetns(t)
	h := mocktest.Open(t, profile)
	_, ctx := ktesting.NewTestContext(t)
	e := &env{t: t, ctx: ctx, hw: h, host: host, dir: t.TempDir(), meta: &fakeMetadata{}, pods: map[types.UID]*api.PodSandbox{}, netns: map[string]func() error{}, uses: map[types.UID][]string{}, returnWait: returnWait}
	e.sock = filepath.Join(e.dir, "nri.sock")
	e.alloc = e.allocator()
	e.client = fake.NewClientset()
	e.status = metadata.NewStatusWriter(e.client, device.NICDriver, nil)
	sctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go e.status.Run(sctx)
	e.startAgent()
	e.startRuntime()
	e.waitReady()
	return e
}

func (e *env) allocator() *allocate.Allocator {
	pfs, err := sriov.Discover(sriov.Options{SysfsRoot: e.hw.Sysfs, Routes: e.hw.NICs(), Eswitch: e.hw.NICs()})
	if err != nil {
		e.t.Fatal(err)
	}
	offers, _ := config.Default().Resolve(pfs)
	res, _ := resources.NIC(testNode, offers, device.AllFeatures)
	var objs []*resourceapi.ResourceSlice
	for _, s := range resources.Objects(device.NICDriver, testNode, res) {
		objs = append(objs, &s)
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: device.NICDriver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", device.NICDriver)}}}}}
	return allocate.New(allocate.ClusterFeatures, testNode, objs, []*resourceapi.DeviceClass{class})
}

// published is a node that publishes an inventory with every feature.
type published hw.Inventory

func (p published) Current() (hw.Inventory, device.Features) {
	return hw.Inventory(p), device.AllFeatures
}

// startAgent starts (or, after stopAgent, restarts) the agent's side: NRI
// plugin, NIC driver and prepare plugin on the env's state directory.
func (e *env) startAgent() {
	e.t.Helper()
	state := filepath.Join(e.dir, "state")
	var err error
	e.net, err = New(Options{DriverName: device.NICDriver, Socket: e.sock, StateDir: state, SysfsRoot: e.hw.Sysfs,
		HostNetns: e.host, RDMA: e.hw.NICs().RDMA(), Status: e.status, BootID: testBoot, Sysfs: e.hw.NICs(),
		Pods: e, Links: e.hw.NICs(), Events: e, ReturnWait: e.returnWait})
	if err != nil {
		e.t.Fatal(err)
	}
	pfs, err := sriov.Discover(sriov.Options{SysfsRoot: e.hw.Sysfs, Routes: e.hw.NICs(), Eswitch: e.hw.NICs()})
	if err != nil {
		e.t.Fatal(err)
	}
	// Every PF shared (the default); claims may choose their VF's MAC.
	cfg, err := config.Parse([]byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\nvfPolicy: {allowMAC: true}\n"))
	if err != nil {
		e.t.Fatal(err)
	}
	d, err := nic.New(nic.Options{
		VFs:       e.hw.NICs().VFConfigurator(),
		Published: published{PFs: pfs}, Config: cfg,
		SysfsRoot: e.hw.Sysfs, DevRoot: e.hw.DevRoot(), StateDir: state, NodeName: testNode, BootID: testBoot, Network: e.net,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if e.nic, err = prepare.New[nic.Record](e.ctx, d, prepare.Options{
		DriverName: device.NICDriver, StateDir: state, CDIDir: filepath.Join(e.dir, "cdi"), BootID: testBoot,
	}); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	e.stopRun, e.runDone = cancel, make(chan struct{})
	go func() {
		defer close(e.runDone)
		_ = e.net.Run(ctx, e.nic, e.meta)
	}()
	e.t.Cleanup(e.stopAgent)
}

// stopAgent stops the agent's side as a crash would: nothing is undone.
func (e *env) stopAgent() {
	if e.stopRun == nil {
		return
	}
	e.stopRun()
	<-e.runDone
	e.stopRun = nil
	e.net.Close()
}

// startRuntime starts NRI's runtime side on the socket; its Synchronize
// lists the env's running pods.
func (e *env) startRuntime() {
	e.rt = nritest.Start(e.t, e.sock, e.running)
}

// stopRuntime stops the runtime side and cuts its connections.
func (e *env) stopRuntime() { e.rt.Stop() }

// waitReady waits until the plugin has connected and synchronized, and
// the runtime has it among its plugins.
func (e *env) waitReady() {
	e.t.Helper()
	waitfor.True(e.t, "NRI plugin connected", 10*time.Second, func() bool { return e.net.Ready() == nil })
	e.rt.Synced()
}

func (e *env) running() []*api.PodSandbox {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*api.PodSandbox
	for _, p := range e.pods {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Uid < out[j].Uid })
	return out
}

// newPod makes a sandbox with a network namespace of its own.
func (e *env) newPod(name string) *api.PodSandbox {
	e.t.Helper()
	sb, remove := nritest.NewPod(e.t, "ns", name)
	e.mu.Lock()
	e.netns[nritest.NetnsPath(sb)] = remove
	e.mu.Unlock()
	return sb
}

func netnsPath(sb *api.PodSandbox) string { return nritest.NetnsPath(sb) }

func (e *env) runPod(sb *api.PodSandbox) error {
	err := e.rt.RunPodSandbox(e.ctx, sb)
	if err == nil {
		e.mu.Lock()
		e.pods[types.UID(sb.Uid)] = sb
		e.mu.Unlock()
	}
	return err
}

func (e *env) stopPod(sb *api.PodSandbox) {
	e.t.Helper()
	e.mu.Lock()
	delete(e.pods, types.UID(sb.Uid))
	e.mu.Unlock()
	if err := e.rt.StopPodSandbox(e.ctx, sb); err != nil {
		e.t.Fatalf("StopPodSandbox: %v", err)
	}
}

func (e *env) removePod(sb *api.PodSandbox) {
	e.t.Helper()
	if err := e.rt.RemovePodSandbox(e.ctx, sb); err != nil {
		e.t.Fatalf("RemovePodSandbox: %v", err)
	}
}

var claimSeq atomic.Int64

// claim is an allocated claim of bandwidth shares with an optional
// VfConfig (JSON fields without apiVersion and kind), reserved for pods,
// and created in the fake API.
func (e *env) claim(vfConfig string, pods []*api.PodSandbox, requests ...string) *resourceapi.ResourceClaim {
	e.t.Helper()
	n := claimSeq.Add(1)
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", n), Namespace: "ns", UID: types.UID(fmt.Sprintf("uid-claim-%d", n))}}
	for _, r := range requests {
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: r, Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: device.NICDriver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{device.NICCapBandwidth: resource.MustParse("10G")}}}})
	}
	if vfConfig != "" {
		raw := `{"apiVersion": "sriov.hwdra.io/v1alpha1", "kind": "VfConfig"` + vfConfig + `}`
		c.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: device.NICDriver, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}}}
	}
	if err := e.alloc.Allocate(e.ctx, c); err != nil {
		e.t.Fatalf("allocate: %v", err)
	}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: types.UID(p.Uid)})
	}
	if _, err := e.client.ResourceV1().ResourceClaims("ns").Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	return c
}

func (e *env) prepare(c *resourceapi.ResourceClaim) error {
	res, err := e.nic.PrepareResourceClaims(e.ctx, []*resourceapi.ResourceClaim{c})
	if err != nil {
		return err
	}
	return res[c.UID].Err
}

func (e *env) mustPrepare(c *resourceapi.ResourceClaim) {
	e.t.Helper()
	if err := e.prepare(c); err != nil {
		e.t.Fatalf("prepare %s: %v", c.Name, err)
	}
}

func (e *env) unprepare(c *resourceapi.ResourceClaim) error {
	res, err := e.nic.UnprepareResourceClaims(e.ctx, []kubeletplugin.NamespacedObject{{UID: c.UID}})
	if err != nil {
		return err
	}
	return res[c.UID]
}

// links is the state of every link in a namespace, by name: the
// stand-ins and their peers on the host, the VFs in a pod.
func links(t *testing.T, path string) map[string]sriov.LinkState {
	t.Helper()
	ns, err := sriov.OpenNetns(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h := handle(t, path)
	ls, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]sriov.LinkState{}
	for _, l := range ls {
		if n := l.Attrs().Name; n == "lo" || strings.HasPrefix(n, "hwp") {
			continue // the stand-ins' peers: the mock's side of the wire
		}
		st, err := ns.ReadLink(l.Attrs().Name)
		if err != nil {
			t.Fatal(err)
		}
		out[st.Name] = st
	}
	return out
}

func handle(t *testing.T, path string) *netlink.Handle { return nritest.Handle(t, path) }

// routes lists a link's IPv4 and IPv6 routes with a destination, as
// "<dst>" or "<dst> via <gw>".
func routes(t *testing.T, path, link string) []string {
	t.Helper()
	h := handle(t, path)
	l, err := h.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := h.RouteList(l, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		s := r.Dst.String()
		if r.Gw != nil {
			s += " via " + r.Gw.String()
		}
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// fakeMetadata records UpdateRequestMetadata calls; the real writer (the
// kubelet plugin library's) is exercised in the agent's tests.
type fakeMetadata struct {
	mu    sync.Mutex
	calls []metadataCall
	fail  error
}

type metadataCall struct {
	Claim   types.UID
	Request string
	Devices []kubeletplugin.Device
}

func (f *fakeMetadata) UpdateRequestMetadata(_ context.Context, _, _ string, uid types.UID, request string, devices []kubeletplugin.Device) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	f.calls = append(f.calls, metadataCall{uid, request, devices})
	return nil
}

func (f *fakeMetadata) Calls() []metadataCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]metadataCall(nil), f.calls...)
}

// claimStatus waits until the claim's status has our entries and returns
// them.
func (e *env) claimStatus(c *resourceapi.ResourceClaim, want func([]resourceapi.AllocatedDeviceStatus) bool) []resourceapi.AllocatedDeviceStatus {
	e.t.Helper()
	var got []resourceapi.AllocatedDeviceStatus
	waitfor.NoError(e.t, "claim "+c.Name+"'s status.devices as expected", 10*time.Second, func() error {
		cl, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Get(e.ctx, c.Name, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		if got = cl.Status.Devices; !want(got) {
			return fmt.Errorf("status.devices %+v", got)
		}
		return nil
	})
	return got
}

func condition(d resourceapi.AllocatedDeviceStatus, typ string) *metav1.Condition {
	for i := range d.Conditions {
		if d.Conditions[i].Type == typ {
			return &d.Conditions[i]
		}
	}
	return nil
}

// placements lists the placements file's keys.
func (e *env) placements() []string { return e.net.ledger.Keys() }
