// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podmetrics

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	gpuprep "github.com/hwdra/hwdra/internal/agent/prepare/gpu"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/hw"
)

// node is a fake node: its claims' devices, pods, GPU processes (their
// cgroup files in a made-up /proc) and published units.
type node struct {
	t        testing.TB
	procRoot string

	mu      sync.Mutex
	devices []Device
	pods    map[types.UID]*corev1.Pod
	procs   map[string][]hw.GPUProcess
	failing map[string]error
	units   []Unit
	made    int
}

func newNode(t testing.TB) *node {
	return &node{t: t, procRoot: t.TempDir(), pods: map[types.UID]*corev1.Pod{}, procs: map[string][]hw.GPUProcess{}, failing: map[string]error{}}
}

func (n *node) Devices() []Device {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Device(nil), n.devices...)
}

func (n *node) List() []*corev1.Pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []*corev1.Pod
	for _, p := range n.pods {
		out = append(out, p)
	}
	return out
}

func (n *node) PodByUID(uid types.UID) (*corev1.Pod, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.pods[uid]
	return p, ok
}

func (n *node) GPUProcesses(gpu string) ([]hw.GPUProcess, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.failing[gpu]; err != nil {
		return nil, err
	}
	return n.procs[gpu], nil
}

func (n *node) Units() []Unit { return n.units }

// pod adds a pod in namespace ns whose container "app" uses the claims
// (directly named).
func (n *node) pod(ns, name string, claims ...string) *corev1.Pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.made++
	p := &corev1.Pod{}
	p.Namespace, p.Name, p.UID = ns, name, types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", n.made))
	c := corev1.Container{Name: "app"}
	for i, claim := range claims {
		ref := fmt.Sprint("c", i)
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: ref, ResourceClaimName: ptr.To(claim)})
		c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: ref})
	}
	p.Spec.Containers = []corev1.Container{c}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://" + strings.Repeat(fmt.Sprintf("%x", n.made%16), 64)}}
	n.pods[p.UID] = p
	return p
}

// run lists a process of pod p (nil: of no pod) on gpu, holding mem
// bytes, in GPU instance gi (nil: none); its cgroup file names the pod's
// container.
func (n *node) run(gpu string, p *corev1.Pod, pid uint32, mem uint64, gi *int) {
	cgroup := "0::/system.slice/some.service\n"
	if p != nil {
		_, id, _ := strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
		cgroup = fmt.Sprintf("0::/kubepods/burstable/pod%s/%s\n", p.UID, id)
	}
	dir := filepath.Join(n.procRoot, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		n.t.Fatal(err)
	}
	n.mu.Lock()
	n.procs[gpu] = append(n.procs[gpu], hw.GPUProcess{PID: pid, UsedMemory: ptr.To(mem), GPUInstance: gi})
	n.mu.Unlock()
}

// collector is a Collector over the fake node, the GPU driver's and the
// NIC driver's claims both its devices.
func (n *node) collector(o Options) *Collector {
	o.NodeName, o.Pods, o.ProcRoot = "worker-1", n, n.procRoot
	c := New(o)
	c.SetGPU(gpuOnly{n}, n)
	c.SetNIC(nicOnly{n})
	return c
}

type gpuOnly struct{ n *node }

func (g gpuOnly) Devices() []Device { return filter(g.n.Devices(), device.GPUDriver) }

type nicOnly struct{ n *node }

func (g nicOnly) Devices() []Device { return filter(g.n.Devices(), device.NICDriver) }

func filter(ds []Device, driver string) []Device {
	var out []Device
	for _, d := range ds {
		if d.Driver == driver {
			out = append(out, d)
		}
	}
	return out
}

// Devices as the checkpoint records them on a mock DGX H100's first two
// GPUs: a whole GPU, a MIG partition (GPU instance 7), a share.
const (
	gpu0, gpu1   = "0000:1b:00.0", "0000:43:00.0"
	uuid0, uuid1 = "GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"
	migUUID      = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
)

func wholeGPU(ns, claim string) Device {
	return Device{Namespace: ns, Claim: claim, ClaimUID: types.UID("uid-" + claim), Request: "gpu", Driver: device.GPUDriver,
		Pool: "worker-1", Name: "gpu-0000-1b-00-0", Type: device.KindGPU, GPU: gpu0, UUID: uuid0}
}

func migDevice(ns, claim string, gi int) Device {
	return Device{Namespace: ns, Claim: claim, ClaimUID: types.UID("uid-" + claim), Request: "mig", Driver: device.GPUDriver,
		Pool: "worker-1", Name: "gpu-0000-43-00-0-mig-1g-10gb-6", Type: device.KindMIG, GPU: gpu1, UUID: uuid1,
		GPUInstance: ptr.To(gi), ComputeInstance: ptr.To(0), Profile: "1g.10gb", MIGUUID: migUUID}
}

func shareDevice(ns, claim string, mem uint64, compute int) Device {
	return Device{Namespace: ns, Claim: claim, ClaimUID: types.UID("uid-" + claim), Request: "share", Driver: device.GPUDriver,
		Pool: "worker-1", Name: "gpu-0000-1b-00-0-share", Type: device.KindShare, GPU: gpu0, UUID: uuid0,
		Sharing: SharingShare, Share: &gpuprep.ShareRecord{Memory: mem, Compute: compute}}
}

// scrape serves the collector's series through the client library's
// handler, as the agent does, and parses them: status and samples, each
// sample a name with its sorted labels ("name{a="x",b="y"}") and value.
func scrape(t testing.TB, c prometheus.Collector) (int, map[string]float64) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("the exposition does not parse: %v", err)
	}
	out := map[string]float64{}
	for name, mf := range families {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				if l.GetValue() != "" {
					ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
			}
			sort.Strings(ls)
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			out[name+"{"+strings.Join(ls, ",")+"}"] = v
		}
	}
	return resp.StatusCode, out
}

// named are the samples of one metric.
func named(samples map[string]float64, name string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range samples {
		if strings.HasPrefix(k, name+"{") {
			out[k] = v
		}
	}
	return out
}
