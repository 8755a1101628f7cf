// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestNodeReady: the node registers and is Ready, with the versions the
// suite pins and the node IP that exists only in the test's namespace.
func TestNodeReady(t *testing.T) {
	n := framework.Shared(t)
	framework.RecordTiming(t, "node start (shared node)", n.StartupTime)
	node, err := n.Admin.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The kubelet says the version the API server says (v1.37.2 as
	// pinned, v1.36.3 under hack/e2e-previous-minor.sh).
	want, err := framework.KubeVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v := node.Status.NodeInfo.KubeletVersion; v != want || !strings.HasPrefix(v, "v1.3") {
		t.Errorf("kubelet version %q, want %s (version ldflags missing from the build?)", v, want)
	}
	if rt := node.Status.NodeInfo.ContainerRuntimeVersion; !strings.HasPrefix(rt, "containerd://2.") {
		t.Errorf("container runtime %q, want containerd 2.x", rt)
	}
	var ip string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			ip = a.Address
		}
	}
	if ip != framework.NodeIP {
		t.Errorf("node InternalIP %q, want %s", ip, framework.NodeIP)
	}
}

// TestPlainPod: a pod with the test app runs, and its own output (read like
// `kubectl logs`) shows its environment and the files it was asked for.
func TestPlainPod(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	ns := n.CreateNamespace(t, "plain")
	pod := framework.TestAppPod("app", "/etc/passwd")
	pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "HWDRA_E2E_MARK", Value: "hello"}}

	began := time.Now()
	if _, err := n.Admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running, err := n.WaitPodRunning(ctx, ns, pod.Name, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	framework.RecordTiming(t, "plain pod creation -> Running", time.Since(began))
	if !strings.HasPrefix(running.Status.PodIP, "10.200.0.") {
		t.Errorf("pod IP %q outside the pod CIDR %s", running.Status.PodIP, framework.PodCIDR)
	}

	logs, err := n.WaitPodLogs(ctx, ns, pod.Name, "app", "=== END", 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"=== ENV",
		"HWDRA_E2E_MARK=hello",
		"KUBERNETES_SERVICE_HOST=", // the kubelet's service environment reached the container
		"=== FILE /etc/passwd",
		"root:x:0:0:",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}

	if err := n.Admin.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := n.WaitPodGone(ctx, ns, pod.Name, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestProcessRunner: the runner the agent tests use (crash with SIGKILL,
// restart with the same arguments), on an ordinary program.
func TestProcessRunner(t *testing.T) {
	n := framework.Shared(t)
	p := n.StartProcess(t, "sleeper", "/bin/sleep", "300")
	if !p.Running() {
		t.Fatalf("not running: %v", p.ExitErr())
	}
	first := p.Pid()
	p.Kill()
	if p.Running() || p.ExitErr() == nil || !strings.Contains(p.ExitErr().Error(), "killed") {
		t.Fatalf("after Kill: running %t, exit %v", p.Running(), p.ExitErr())
	}
	if err := p.Restart(time.Second); err != nil {
		t.Fatal(err)
	}
	if !p.Running() || p.Pid() == first {
		t.Fatalf("after Restart: running %t, pid %d (was %d)", p.Running(), p.Pid(), first)
	}
	p.Stop(time.Second)
	if p.Running() {
		t.Fatal("still running after Stop")
	}
}
