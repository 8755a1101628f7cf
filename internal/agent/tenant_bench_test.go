// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// Environment of the test binary run as a tenant's process that holds
// connections to the agent (TestHelperHoldConnections).
const (
	holdAddrEnv  = "HWDRA_TEST_HOLD_ADDR"
	holdConnsEnv = "HWDRA_TEST_HOLD_CONNS"
)

// BenchmarkTenantAgentMemory (issue 34, "Bad input"): the agent on a mock
// H100 with a GPU share prepared, while a tenant's pod runs 100 MPS
// clients with 6 MB environments each (real processes, in the mock's GPU
// process list, in the pod's cgroup as the test's /proc shows it) and
// holds 10,000 connections to its metrics port (another process: half
// idle keep-alive connections after a request, half silent). The police
// runs every 100 ms; once it has read every process's environment and
// the connections are held, the kubelet's probe must get through, and
// the process's resident memory is reported before the tenant (idle),
// under its load (load; peak: the most meanwhile) and after a GC there,
// with the Go heap in use
// (the process also holds the test binary and the fake API server: an
// upper bound). The chart's limit is 256 MiB.
func BenchmarkTenantAgentMemory(b *testing.B) {
	bigStack(b)
	procRoot := b.TempDir()
	node := openNode(b, "gpus: [{model: h100-80gb, count: 1, pciBusIDs: [\"0000:1b:00.0\"]}]")
	cfg := filepath.Join(b.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\ngpus: {shares: {overuse: Stop, checkIntervalMilliseconds: 100}}\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	a := startAgentWith(b, Options{node: node, Rescan: time.Minute, ConfigPath: cfg, procRoot: procRoot})
	claim := a.allocated(a.slices(device.GPUDriver, nil), "share", exactly("share.gpu.hwdra.io", ""))
	prepareClaims(b, a, device.GPUDriver, claim)
	pod := tenantPod(b, a, claim.Name)

	const procs = 100
	var listed []hw.GPUProcess
	for range procs {
		cmd := exec.Command("sleep", "600")
		cmd.Env = fatEnv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=1")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		cmd.Env = nil // the 6 MB is the child's, not this process's
		b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		placeInPod(b, procRoot, cmd.Process.Pid, pod)
		listed = append(listed, hw.GPUProcess{PID: uint32(cmd.Process.Pid), UsedMemory: ptr.To(uint64(1 << 20)), MPS: true})
	}
	debug.FreeOSMemory() // starting 6 MB processes left garbage here
	idle := rssKiB(b)
	// The peak from here on (VmHWM, reset: proc(5), clear_refs).
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Fatal(err)
	}
	if err := node.Mock().SetGPUProcesses("0000:1b:00.0", listed); err != nil {
		b.Fatal(err)
	}
	held := holdConnections(b, a.opts.MetricsAddress, 10000)
	// Every environment read once: 6 MB processes, 32 MiB a round.
	rounds := a.counter("hwdra_gpu_share_check_duration_seconds_count")
	waitfor.True(b, "the police's rounds over 100 processes", 30*time.Second, func() bool {
		return a.counter("hwdra_gpu_share_check_duration_seconds_count") >= rounds+30
	})

	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + a.opts.MetricsAddress + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("the kubelet's probe while a tenant holds %d connections: %v %v", held, resp, err)
	}
	resp.Body.Close()
	if n := a.counter(`hwdra_gpu_share_violations_total{action="stopped",reason="GPUShareLimitsRaised"}`); n != 0 {
		b.Errorf("%v processes within their share stopped", n)
	}
	loaded, peak := rssKiB(b), statusKiB(b, "VmHWM")
	debug.FreeOSMemory()
	rss := rssKiB(b)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	unprepareClaims(b, a, device.GPUDriver, claim) // its MPS daemon would outlive the agent
	a.stop()
	for b.Loop() {
	}
	b.ReportMetric(float64(idle)/1024, "RSS-idle-MiB")
	b.ReportMetric(float64(loaded)/1024, "RSS-load-MiB")
	b.ReportMetric(float64(peak)/1024, "RSS-peak-MiB")
	b.ReportMetric(float64(rss)/1024, "RSS-MiB")
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
	b.Logf("RSS %d MiB before the tenant; with 100 processes of 6 MB environments policed and %d connections held, %d MiB (at most %d MiB meanwhile; %d MiB after a GC), heap in use %.1f MiB",
		idle>>10, held, loaded>>10, peak>>10, rss>>10, float64(ms.HeapInuse)/(1<<20))
}

// statusKiB is a "<name>: <n> kB" line of /proc/self/status.
func statusKiB(b testing.TB, name string) int {
	b.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, name+":"); ok {
			kib, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			if err != nil {
				b.Fatal(err)
			}
			return kib
		}
	}
	b.Fatalf("no %s in /proc/self/status", name)
	return 0
}

// tenantPod is a pod of the node whose container "app" uses claim, as the
// agent's pod informer sees it.
func tenantPod(b testing.TB, a *testAgent, claim string) *corev1.Pod {
	b.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "tenant", UID: types.UID("0a0a0a0a-0000-4000-8000-000000000001")}}
	p.Spec.NodeName = node
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}}
	p.Spec.Containers = []corev1.Container{{Name: "app", Image: "app", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", ContainerID: "containerd://" + strings.Repeat("ab", 32)}}
	created, err := a.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return created
}

// placeInPod makes the test's /proc show pid as a process of pod's
// container: the kernel's stat, comm and environ, the pod's cgroup.
func placeInPod(b testing.TB, procRoot string, pid int, pod *corev1.Pod) {
	b.Helper()
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"stat", "comm", "environ"} {
		if err := os.Symlink(fmt.Sprintf("/proc/%d/%s", pid, name), filepath.Join(dir, name)); err != nil {
			b.Fatal(err)
		}
	}
	_, id, _ := strings.Cut(pod.Status.ContainerStatuses[0].ContainerID, "://")
	cgroup := fmt.Sprintf("0::/kubepods/burstable/pod%s/%s\n", pod.UID, id)
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		b.Fatal(err)
	}
}

// fatEnv is an environment of 6 MB (about the most exec(2) takes) in
// strings of 128 KB, followed by vars.
func fatEnv(vars ...string) []string {
	var env []string
	for i := range 47 {
		env = append(env, fmt.Sprintf("PAD%02d=%s", i, strings.Repeat("x", 128000-len("PAD00="))))
	}
	return append(env, vars...)
}

// bigStack raises the stack limit, which children inherit, so that exec
// takes 6 MB of environment.
func bigStack(b testing.TB) {
	b.Helper()
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_STACK, &old); err != nil {
		b.Fatal(err)
	}
	raised := old
	raised.Cur = 64 << 20
	if raised.Max != unix.RLIM_INFINITY && raised.Max < raised.Cur {
		b.Skipf("the stack's hard limit (%d) is too low for 6 MB environments", raised.Max)
	}
	if err := unix.Setrlimit(unix.RLIMIT_STACK, &raised); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_STACK, &old) })
}

// holdConnections runs the test binary as a tenant's process that opens
// n connections to addr and holds them until the benchmark ends; it
// returns how many it opened.
func holdConnections(b testing.TB, addr string, n int) int {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldConnections$")
	cmd.Env = append(os.Environ(), holdAddrEnv+"="+addr, holdConnsEnv+"="+strconv.Itoa(n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "held "); ok {
			held, _ := strconv.Atoi(rest)
			return held
		}
	}
	b.Fatalf("the connection holder ended: %v", sc.Err())
	return 0
}

// TestHelperHoldConnections is BenchmarkTenantAgentMemory's tenant
// process (it skips itself otherwise): it opens the connections, half of
// them after one request kept alive, says "held <n>" and waits for its
// stdin to close.
func TestHelperHoldConnections(t *testing.T) {
	addr := os.Getenv(holdAddrEnv)
	if addr == "" {
		t.Skip("a helper process of BenchmarkTenantAgentMemory")
	}
	n, _ := strconv.Atoi(os.Getenv(holdConnsEnv))
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < uint64(n)+100 {
		lim.Cur = min(uint64(n)+100, lim.Max)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < uint64(n)+100 {
			t.Fatalf("open files limit %d for %d connections: %v", lim.Cur, n, err)
		}
	}
	var conns []net.Conn
	for i := range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
		if i%2 == 0 {
			_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n")
		}
	}
	fmt.Printf("held %d\n", len(conns))
	_, _ = io.Copy(io.Discard, os.Stdin)
}
