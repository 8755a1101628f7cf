// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/hwdra/hwdra/deploy"
	"github.com/hwdra/hwdra/internal/agent/publish/publishtest"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/state"
	"github.com/hwdra/hwdra/internal/tools/allocate"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/waitfor"
)

const node = "worker-1"

// testAgent runs the agent on mock hardware against a fake API server, with
// the kubelet's directories in a temp dir.
type testAgent struct {
	t      testing.TB
	dir    string
	client *fake.Clientset
	cancel context.CancelFunc
	done   chan error
	opts   Options
}

// startAgent starts the agent; before registers API reactors first.
func startAgent(t testing.TB, profile string, before ...func(*fake.Clientset)) *testAgent {
	t.Helper()
	hardware := profile
	if !strings.HasPrefix(profile, "mock:") {
		hardware = "mock:" + writeProfile(t, profile)
	}
	return startAgentWith(t, Options{Hardware: hardware}, before...)
}

// startAgentOn starts the agent on hardware the test opened.
func startAgentOn(t testing.TB, node *backend.Node, rescan time.Duration) *testAgent {
	t.Helper()
	return startAgentWith(t, Options{node: node, Rescan: rescan})
}

func writeProfile(t testing.TB, profile string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "profile.yaml")
	if err := os.WriteFile(file, []byte(profile), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// startAgentWith runs the agent against a fake API server, with the
// kubelet's directories in a temp dir.
func startAgentWith(t testing.TB, opts Options, before ...func(*fake.Clientset)) *testAgent {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "registry"), 0o755); err != nil { // the kubelet's
		t.Fatal(err)
	}
	a := &testAgent{t: t, dir: dir, done: make(chan error, 1),
		client: publishtest.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})}
	for _, f := range before {
		f(a.client)
	}
	ctx := context.Background()
	if tt, ok := t.(*testing.T); ok {
		_, ctx = ktesting.NewTestContext(tt)
	}
	ctx, a.cancel = context.WithCancel(ctx)
	opts.NodeName, opts.KubeClient = node, a.client
	opts.RegistrarDir, opts.PluginsDir = filepath.Join(dir, "registry"), filepath.Join(dir, "plugins")
	opts.CDIDir, opts.StateDir = filepath.Join(dir, "cdi"), filepath.Join(dir, "state")
	if opts.Rescan == 0 {
		opts.Rescan = 100 * time.Millisecond
	}
	opts.MetricsAddress = freeAddress(t)
	a.opts = opts
	go func() { a.done <- Run(ctx, opts) }()
	t.Cleanup(a.stop)
	return a
}

// settle waits until the agent's publisher has made two whole rescans
// after the call (three completed: one may have been under way), so that
// whatever they would publish has been handed to the API.
func (a *testAgent) settle() {
	a.t.Helper()
	want := a.counter("hwdra_rescans_total") + 3
	waitfor.True(a.t, fmt.Sprintf("%v rescans", want), 30*time.Second, func() bool { return a.counter("hwdra_rescans_total") >= want })
}

// publications counts the times the agent handed a driver's changed
// slices to the API.
func (a *testAgent) publications() float64 {
	return a.counter(`hwdra_resource_publications_total{driver="gpu.hwdra.io"}`) +
		a.counter(`hwdra_resource_publications_total{driver="sriov.hwdra.io"}`)
}

// quietWrites waits until the agent is at rest (two rescans hand nothing
// new to the API, and what it last handed is stored: the ready probe no
// longer names ResourceSlices) and returns its slice writes.
func (a *testAgent) quietWrites() int {
	a.t.Helper()
	waitfor.True(a.t, "the agent at rest (two rescans publish nothing, all stored)", 30*time.Second, func() bool {
		before := a.publications()
		a.settle()
		_, ready := probe(a.t, a.opts.MetricsAddress, "/readyz")
		return a.publications() == before && !strings.Contains(ready, "ResourceSlices")
	})
	return a.writes()
}

// socket is a driver's DRA socket.
func (a *testAgent) socket(driver string) string {
	return filepath.Join(a.dir, "plugins", driver, "dra.sock")
}

func (a *testAgent) stop() {
	if a.cancel == nil {
		return
	}
	a.cancel()
	a.cancel = nil
	select {
	case err := <-a.done:
		if err != nil {
			a.t.Errorf("agent: %v", err)
		}
	case <-time.After(30 * time.Second):
		a.t.Error("agent did not stop within 30s of cancellation")
	}
}

// slices waits until the driver's pool is complete (and ok) and returns it.
func (a *testAgent) slices(driver string, ok func([]*resourceapi.ResourceSlice) bool) []*resourceapi.ResourceSlice {
	a.t.Helper()
	return publishtest.WaitPool(a.t, a.client, driver, ok)
}

func (a *testAgent) dial(path string) *grpc.ClientConn {
	a.t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		a.t.Fatal(err)
	}
	a.t.Cleanup(func() { conn.Close() })
	return conn
}

func (a *testAgent) writes() int { return publishtest.Writes(a.client) }

func deviceNames(ss []*resourceapi.ResourceSlice) map[string]bool {
	out := map[string]bool{}
	for _, s := range ss {
		for _, d := range s.Spec.Devices {
			out[d.Name] = true
		}
	}
	return out
}

// allocated is a claim allocated by the scheduler's allocator over the
// published slices and stored in the API, as the scheduler would.
func (a *testAgent) allocated(ss []*resourceapi.ResourceSlice, name string, req resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	a.t.Helper()
	return a.allocatedWith(ss, name, req, "")
}

// allocatedWith is allocated with an opaque GPU configuration for the
// request ("": none).
func (a *testAgent) allocatedWith(ss []*resourceapi.ResourceSlice, name string, req resourceapi.DeviceRequest, config string) *resourceapi.ResourceClaim {
	a.t.Helper()
	classes, err := deploy.DeviceClasses()
	if err != nil {
		a.t.Fatal(err)
	}
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}},
	}
	if config != "" {
		c.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: device.GPUDriver, Parameters: runtime.RawExtension{Raw: []byte(config)}},
		}}}
	}
	if err := allocate.New(allocate.ClusterFeatures, node, ss, classes).Allocate(context.Background(), c); err != nil {
		a.t.Fatal(err)
	}
	if _, err := a.client.ResourceV1().ResourceClaims("default").Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		a.t.Fatal(err)
	}
	return c
}

func migRequest(profile string) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: "mig", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "mig.gpu.hwdra.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.attributes["gpu.hwdra.io"].profile == %q`, profile)}}},
	}}
}

func TestAgentServesTheKubelet(t *testing.T) {
	a := startAgent(t, "gpus:\n- model: h100-80gb\n  count: 2\n")
	ctx := context.Background()
	full := device.GPUName("0000:1b:00.0")
	published := a.slices(device.GPUDriver, nil)
	if !deviceNames(published)[full] {
		t.Fatalf("%s not published", full)
	}

	// The kubelet finds the plugin through the registrar socket.
	info, err := registerapi.NewRegistrationClient(a.dial(filepath.Join(a.dir, "registry", "gpu.hwdra.io-reg.sock"))).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != "gpu.hwdra.io" || info.Endpoint != filepath.Join(a.dir, "plugins", "gpu.hwdra.io", "dra.sock") {
		t.Fatalf("registration info %+v", info)
	}

	claim := a.allocated(published, "mig", migRequest("3g.40gb"))
	dev := claim.Status.Allocation.Devices.Results[0].Device
	dra := drapb.NewDRAPluginClient(a.dial(info.Endpoint))
	pbClaim := &drapb.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}
	resp, err := dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{pbClaim}})
	if err != nil {
		t.Fatal(err)
	}
	// The claim's status.devices entry: claimstatus_test.go.
	res := resp.Claims[string(claim.UID)]
	if res.Error != "" || len(res.Devices) != 1 || res.Devices[0].DeviceName != dev {
		t.Fatalf("prepare: %+v", res)
	}
	ids := res.Devices[0].CdiDeviceIds
	if !slices.ContainsFunc(ids, func(id string) bool { return strings.HasPrefix(id, "gpu.hwdra.io/claim=") }) {
		t.Fatalf("no claim CDI device in %v", ids)
	}
	injectCDI(t, filepath.Join(a.dir, "cdi"), ids)

	// The GPU instance exists now, but the slices stay as they were: the
	// counters keep the scheduler off what overlaps the allocated device.
	a.settle()
	if ss := a.slices(device.GPUDriver, nil); !maps.Equal(deviceNames(ss), deviceNames(published)) {
		t.Errorf("the slices changed with a prepared MIG claim")
	}
	// A repeated prepare (kubelet restart) gives the same answer.
	again, err := dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{pbClaim}})
	if err != nil || !slices.Equal(again.Claims[string(claim.UID)].Devices[0].CdiDeviceIds, ids) {
		t.Fatalf("second prepare: %+v %v", again, err)
	}

	un, err := dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{pbClaim}})
	if err != nil || un.Claims[string(claim.UID)].Error != "" {
		t.Fatalf("unprepare: %+v %v", un, err)
	}
	if specs, _ := filepath.Glob(filepath.Join(a.dir, "cdi", "gpu.hwdra.io_*")); len(specs) != 0 {
		t.Fatalf("CDI specs left after unprepare: %v", specs)
	}

	// At rest the agent makes no API writes, though it keeps rescanning.
	before, publications := a.writes(), a.publications()
	a.settle()
	if after := a.writes(); after != before {
		t.Fatalf("%d ResourceSlice writes while at rest", after-before)
	}
	if p := a.publications(); p != publications {
		t.Fatalf("%v publications while at rest", p-publications)
	}

	for sample, want := range map[string]string{
		`hwdra_claim_operation_duration_seconds_count{driver="gpu.hwdra.io",kind="mig",operation="prepare",result="success"}`:   "2",
		`hwdra_claim_operation_duration_seconds_count{driver="gpu.hwdra.io",kind="mig",operation="unprepare",result="success"}`: "1",
		// Two GPUs, each whole and in 20 MIG (profile, placement) devices.
		`hwdra_published_devices{driver="gpu.hwdra.io",kind="gpu"}`: "2",
		`hwdra_published_devices{driver="gpu.hwdra.io",kind="mig"}`: "40",
	} {
		if got := a.metric(sample); got != want {
			t.Errorf("metric %s = %q, want %q", sample, got, want)
		}
	}

	// SIGTERM: a clean stop that removes the sockets.
	a.stop()
	if _, err := os.Stat(info.Endpoint); !os.IsNotExist(err) {
		t.Errorf("plugin socket left behind: %v", err)
	}
}

// injectCDI does what a container runtime does with the CDI IDs and checks
// the container gets device nodes and the NVIDIA environment.
func injectCDI(t *testing.T, dir string, ids []string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Log("not root: the mock's device nodes are plain files, skipping CDI injection")
		return
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatalf("inject %v: %v", ids, err)
	}
	var paths []string
	for _, d := range spec.Linux.Devices {
		paths = append(paths, d.Path)
	}
	for _, want := range []string{"/dev/nvidiactl", "/dev/nvidia0"} {
		if !slices.Contains(paths, want) {
			t.Errorf("container lacks %s (has %v)", want, paths)
		}
	}
	if !slices.ContainsFunc(spec.Process.Env, func(e string) bool { return strings.HasPrefix(e, "NVIDIA_VISIBLE_DEVICES=") }) {
		t.Errorf("no NVIDIA_VISIBLE_DEVICES in %v", spec.Process.Env)
	}
}

// TestAgentStartsOnACorruptCheckpoint: a checkpoint the agent cannot read is
// set aside and reported; the agent serves instead of crash-looping.
func TestAgentStartsOnACorruptCheckpoint(t *testing.T) {
	a := startAgent(t, "gpus:\n- model: h100-80gb\n  count: 1\n", func(*fake.Clientset) {})
	a.slices(device.GPUDriver, nil)
	a.stop()
	path := filepath.Join(a.dir, "state", "gpu.hwdra.io.checkpoint.json")
	if err := state.Replace(path, []byte(`{"version":"hwdra.io/checkpoint/v1","checksum":"sha256:0","data":{`)); err != nil {
		t.Fatal(err)
	}
	restartAgent(t, a)
	waitfor.True(t, "the restarted agent's plugin socket", 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(a.dir, "plugins", "gpu.hwdra.io", "dra.sock"))
		return err == nil
	})

	if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) != 1 {
		t.Fatalf("corrupt checkpoint not set aside: %v", m)
	}
}

// restartAgent starts a new agent on the same directories and hardware
// profile as a stopped one.
func restartAgent(t *testing.T, a *testAgent) *testAgent {
	t.Helper()
	b := &testAgent{t: t, dir: a.dir, client: a.client, done: make(chan error, 1), opts: a.opts}
	_, ctx := ktesting.NewTestContext(t)
	ctx, b.cancel = context.WithCancel(ctx)
	go func() { b.done <- Run(ctx, a.opts) }()
	t.Cleanup(b.stop)
	return b
}

// freeAddress is a loopback address with a port free right now.
func freeAddress(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// counter is the value of one sample line of the agent's /metrics, 0
// while it is absent.
func (a *testAgent) counter(sample string) float64 {
	a.t.Helper()
	v := a.metric(sample)
	if v == "" {
		return 0
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		a.t.Fatalf("%s: not a number: %q", sample, v)
	}
	return f
}

// metric returns the value of one sample line of the agent's /metrics.
func (a *testAgent) metric(sample string) string {
	a.t.Helper()
	resp, err := http.Get("http://" + a.opts.MetricsAddress + "/metrics")
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			return v
		}
	}
	return ""
}
