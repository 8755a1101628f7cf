// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// podWithClaim is a pod of the node whose container "app" (runtime ID id)
// uses claim, stored in the fake API.
func podWithClaim(t *testing.T, a *testAgent, name, claim, id string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012x", len(name)*7919+int(name[0])))},
		Spec: corev1.PodSpec{
			NodeName:       node,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}},
			Containers:     []corev1.Container{{Name: "app", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
		},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://" + id}}},
	}
	if _, err := a.client.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeProcess writes a made-up /proc/<pid>/cgroup naming pod p's
// container id, as the kubelet's cgroupfs driver names it (p nil: a
// system service's).
func fakeProcess(t *testing.T, procRoot string, pid uint32, p *corev1.Pod, id string) {
	t.Helper()
	dir := filepath.Join(procRoot, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cgroup := "0::/system.slice/nvidia-persistenced.service\n"
	if p != nil {
		cgroup = fmt.Sprintf("0::/kubepods/besteffort/pod%s/%s\n", p.UID, id)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPodMetricsFollowClaims: through the agent on a mock H100 pair, a
// whole GPU and a MIG partition prepared by the kubelet's API for two
// pods: the info series name each pod with the labels dcgm-exporter gives
// the same hardware (the GPU's UUID as published, the MIG instance's ID
// as the hardware has it), and the memory the GPU lists for each pod's
// process is that pod's. Scrapes run all along and never fail or hold a
// prepare up. After an agent restart the series are back from the
// checkpoint; after an unprepare its claim's are gone at the next scrape.
func TestPodMetricsFollowClaims(t *testing.T) {
	n := openNode(t, "gpus: [{model: h100-80gb, count: 2, mig: true}]")
	procRoot := t.TempDir()
	a := startAgentWith(t, Options{node: n, procRoot: procRoot, Rescan: time.Second})
	ss := a.slices(device.GPUDriver, nil)

	done := scrapeAlong(t, a)
	whole := a.allocated(ss, "whole", resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: device.GPUDriver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["resource.kubernetes.io"].pciBusID == "0000:1b:00.0"`}}},
	}})
	mig := a.allocated(ss, "mig", migOn("1g.10gb", "0000:43:00.0", 6))
	idWhole, idMIG := strings.Repeat("a", 64), strings.Repeat("b", 64)
	pw, pm := podWithClaim(t, a, "trainer", "whole", idWhole), podWithClaim(t, a, "tiny", "mig", idMIG)
	prepared := time.Now()
	prepareClaims(t, a, device.GPUDriver, whole, mig)
	t.Logf("two claims prepared in %v while Prometheus scraped", time.Since(prepared))

	gpus, err := n.GPU().GPUs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	uuids := map[string]string{}
	for _, g := range gpus {
		uuids[g.PCIBusID] = g.UUID
	}
	instances, err := n.GPU().GPUInstances("0000:43:00.0")
	if err != nil || len(instances) != 1 {
		t.Fatalf("GPU instances of 0000:43:00.0: %+v %v", instances, err)
	}
	gi := instances[0].ID
	fakeProcess(t, procRoot, 4001, pw, idWhole)
	fakeProcess(t, procRoot, 4002, pm, idMIG)
	if err := n.Mock().SetGPUProcesses("0000:1b:00.0", []hw.GPUProcess{{PID: 4001, UsedMemory: ptr.To(uint64(30 << 30))}}); err != nil {
		t.Fatal(err)
	}
	if err := n.Mock().SetGPUProcesses("0000:43:00.0", []hw.GPUProcess{{PID: 4002, UsedMemory: ptr.To(uint64(3 << 30)), GPUInstance: ptr.To(gi)}}); err != nil {
		t.Fatal(err)
	}

	infoWhole := fmt.Sprintf(`hwdra_claim_device_info{GPU_I_ID="",GPU_I_PROFILE="",Hostname="worker-1",UUID=%q,claim="whole",compute_instance="",device="gpu-0000-1b-00-0",driver="gpu.hwdra.io",mig_uuid="",namespace="default",pci_address="0000:1b:00.0",pod="trainer",pool="worker-1",request="gpu",sharing="",type="gpu"}`, uuids["0000:1b:00.0"])
	infoMIG := fmt.Sprintf(`hwdra_claim_device_info{GPU_I_ID="%d",GPU_I_PROFILE="1g.10gb",Hostname="worker-1",UUID=%q,claim="mig",`, gi, uuids["0000:43:00.0"])
	memWhole := fmt.Sprintf(`hwdra_pod_gpu_memory_used_bytes{GPU_I_ID="",Hostname="worker-1",UUID=%q,claim="whole",device="gpu-0000-1b-00-0",namespace="default",pod="trainer"}`, uuids["0000:1b:00.0"])
	memMIG := fmt.Sprintf(`hwdra_pod_gpu_memory_used_bytes{GPU_I_ID="%d",Hostname="worker-1",UUID=%q,claim="mig",device="gpu-0000-43-00-0-mig-1g-10gb-6",namespace="default",pod="tiny"}`, gi, uuids["0000:43:00.0"])
	check := func(when string) {
		t.Helper()
		waitfor.True(t, "the pods' series "+when, 30*time.Second, func() bool {
			body := a.scrapeOrNothing()
			return strings.Contains(body, infoWhole+" 1") && strings.Contains(body, infoMIG) &&
				strings.Contains(body, memWhole+" 3.221225472e+10") && strings.Contains(body, memMIG+" 3.221225472e+09")
		})

	}
	check("after prepare")

	done()
	// The agent restarts: the series come back from the checkpoint.
	a.restart()
	check("after a restart")
	done = scrapeAlong(t, a)

	pb := &drapb.Claim{Namespace: mig.Namespace, Name: mig.Name, Uid: string(mig.UID)}
	resp, err := drapb.NewDRAPluginClient(a.dial(a.socket(device.GPUDriver))).NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{pb}})
	if err != nil || resp.Claims[string(mig.UID)].Error != "" {
		t.Fatalf("unprepare: %v %+v", err, resp)
	}
	if body := a.scrape(); strings.Contains(body, `claim="mig"`) || !strings.Contains(body, infoWhole+" 1") {
		t.Errorf("the scrape after the unprepare:\n%s", grep(body, "claim="))
	}
	done()
}

// scrapeAlong scrapes the agent over and over, as Prometheus would while
// claims come and go, until the returned func is called, which checks
// that every scrape succeeded.
func scrapeAlong(t *testing.T, a *testAgent) func() {
	var scrapes, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := http.Get("http://" + a.opts.MetricsAddress + "/metrics")
			if err != nil || resp.StatusCode != http.StatusOK {
				failed.Add(1)
			}
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			scrapes.Add(1)
		}
	})
	return func() {
		t.Helper()
		close(stop)
		wg.Wait()
		if failed.Load() != 0 || scrapes.Load() == 0 {
			t.Errorf("%d of %d scrapes failed", failed.Load(), scrapes.Load())
		}
		t.Logf("%d scrapes beside the claims' prepares and unprepares", scrapes.Load())
	}
}

// scrape is the agent's /metrics.
func (a *testAgent) scrape() string {
	a.t.Helper()
	resp, err := http.Get("http://" + a.opts.MetricsAddress + "/metrics")
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return string(b)
}

// scrapeOrNothing is the agent's /metrics, "" while it does not answer.
func (a *testAgent) scrapeOrNothing() string {
	resp, err := http.Get("http://" + a.opts.MetricsAddress + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// restart stops the agent and runs it again with the same options (state
// directory, hardware), as a crash-free pod restart would.
func (a *testAgent) restart() {
	a.t.Helper()
	a.stop()
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() { a.done <- Run(ctx, a.opts) }()
	a.slices(device.GPUDriver, nil)
}

func grep(body, s string) string {
	var out []string
	for line := range strings.SplitSeq(body, "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
