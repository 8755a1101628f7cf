// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestTenantAgentPodUnderLoad (issue 34, rows 3 and 7, on the real node):
// a share pod's container holds 100 processes with 6 MB environments
// each, which the mock GPU lists as MPS clients within the share, and
// 10,000 connections are held open to the agent's metrics port on the
// node's IP (half idle keep-alive after a request, half silent). The
// agent pod, under the chart's 256 MiB limit, polices them round after
// round, answers /readyz on a fresh connection, is never restarted, and
// its resident memory and its memory cgroup's are logged ("MEMORY
// agent-pod tenant-load ...").
func TestTenantAgentPodUnderLoad(t *testing.T) {
	s, mockDir, _ := startLastingAgentPodWith(t, "tenant-load", oneH100, policing("Stop"))
	gpu := gpuBusID(t, mockDir)
	app := s.runSharePod("fat", "40Gi", "50", "")
	cgroupProcs := containerCgroupProcs(t, appPID(t, app))

	// 6 MB environments take a stack limit of 24 MiB or more at exec.
	var stack syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_STACK, &stack); err != nil {
		t.Fatal(err)
	}
	raised := stack
	raised.Cur = 64 << 20
	if err := syscall.Setrlimit(syscall.RLIMIT_STACK, &raised); err != nil {
		t.Fatal(err)
	}
	env := []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50"}
	for i := range 47 {
		env = append([]string{fmt.Sprintf("PAD%02d=%s", i, strings.Repeat("x", 128000-len("PAD00=")))}, env...)
	}
	var listed []string
	for range 100 {
		cmd := exec.Command("sleep", "600")
		cmd.Env = env
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		// Into the app container's cgroup: a process of the pod, as the
		// police finds it.
		if err := os.WriteFile(cgroupProcs, []byte(fmt.Sprint(cmd.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
		listed = append(listed, fmt.Sprintf("%d:1Mi:mps", cmd.Process.Pid))
	}
	_ = syscall.Setrlimit(syscall.RLIMIT_STACK, &stack)
	listProcesses(t, mockDir, gpu, listed...)
	t.Cleanup(func() { listProcesses(t, mockDir, gpu) })

	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range 10000 {
		c, err := net.Dial("tcp", framework.AgentAddr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
		if i%2 == 0 {
			_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: agent\r\n\r\n")
		}
	}
	// Enough rounds to have read every environment (6 a round at most).
	waitRounds(t, policeRounds(t), 30)
	probe := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := probe.Get("http://" + framework.AgentAddr + "/readyz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz while a tenant holds 10,000 connections: %v %v", resp, err)
	}
	resp.Body.Close()
	m, err := s.agent.Memory()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MEMORY agent-pod tenant-load %s", m)
	pod, err := s.n.Admin.CoreV1().Pods(framework.AgentNamespace).Get(s.ctx, s.agent.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := pod.Status.ContainerStatuses[0]; c.RestartCount != 0 || !c.Ready {
		t.Errorf("the agent pod: %d restarts, ready %v (last state %+v)", c.RestartCount, c.Ready, c.LastTerminationState)
	}
	s.untouched("fat", appPID(t, app))
}

// containerCgroupProcs is the cgroup.procs file of pid's container in
// the pids hierarchy (cgroup v1, the suite's kubelet's cgroupfs driver).
func containerCgroupProcs(t *testing.T, pid uint32) string {
	t.Helper()
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(cg), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && parts[1] == "pids" {
			return filepath.Join("/sys/fs/cgroup/pids", parts[2], "cgroup.procs")
		}
	}
	t.Fatalf("process %d: no pids cgroup in %q", pid, cg)
	return ""
}
