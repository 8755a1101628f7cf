// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestAgentPodLeavesGPUsToTheDevicePlugin: the agent pod on 8 GPUs stops
// publishing them while NVIDIA's device plugin is seen on the node, and
// says why in /readyz (staying ready), its metrics and its log; once the
// plugin is gone the same GPUs are published again. Seen two ways, each
// on its own: the plugin's socket in the kubelet's device-plugin
// directory (nvidia-gpu.sock, a listening unix socket as the plugin's
// gRPC server makes), and the node advertising nvidia.com/gpu in its
// status (patched as a device plugin's registration makes the kubelet
// do). Meanwhile a pod asking for nvidia.com/gpu is not placed on hwdra's
// devices.
func TestAgentPodLeavesGPUsToTheDevicePlugin(t *testing.T) {
	s := startScenario(t, "device-plugin", framework.MockProfile(t, "eight-h100", eightH100), gpuDriver)
	all := s.gpuDevices()
	if len(all) == 0 {
		t.Fatal("no GPU devices published")
	}

	// Its socket, made where the tests see the node's device-plugin
	// directory; the agent names it where the node sees it.
	sock := filepath.Join(framework.DevicePluginDir, "nvidia-gpu.sock")
	if err := os.MkdirAll(s.n.KubeletDevicePluginDir(), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(s.n.KubeletDevicePluginDir(), filepath.Base(sock)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	s.checkWithdrawn(1, "its socket "+sock, "socket", "device-plugin-socket")
	s.createGPUPod("meanwhile", 1)
	t.Logf("nvidia.com/gpu: 1 while the device plugin's socket is there: %s", s.waitPending("meanwhile"))
	s.deletePod("meanwhile")
	l.Close() // removes the socket, as the plugin does when it stops
	s.checkRestored(1, all, "device-plugin-socket-gone")

	// The node's status.
	nodes := s.n.Admin.CoreV1().Nodes()
	patch := func(v string) {
		t.Helper()
		body := fmt.Sprintf(`{"status":{"capacity":{%q:%s}}}`, gpuResource, v)
		if _, err := nodes.Patch(s.ctx, s.n.Name, types.MergePatchType, []byte(body), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
	}
	patch(`"8"`)
	t.Cleanup(func() { patch("null") })
	s.checkWithdrawn(2, "the node advertises nvidia.com/gpu=8", "node", "device-plugin-node-status")
	patch("null") // the kubelet drops it from allocatable at its next status update
	s.checkRestored(2, all, "device-plugin-node-status-gone")
}

// gpuDevices are the GPU devices this node publishes now.
func (s *scenario) gpuDevices() map[string]bool {
	s.t.Helper()
	list, err := s.n.Admin.ResourceV1().ResourceSlices().List(s.ctx, metav1.ListOptions{
		FieldSelector: "spec.nodeName=" + s.n.Name + ",spec.driver=" + gpuDriver,
	})
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[string]bool{}
	for _, sl := range list.Items {
		for _, d := range sl.Spec.Devices {
			out[d.Name] = true
		}
	}
	return out
}

// waitGPUDevices waits until the node publishes n GPU devices.
func (s *scenario) waitGPUDevices(n int) {
	s.t.Helper()
	if err := waitfor.Until(s.ctx, fmt.Sprintf("%d GPU devices published", n), 60*time.Second, func() bool { return len(s.gpuDevices()) == n }); err != nil {
		s.t.Fatalf("%v: %d published\n%s", err, len(s.gpuDevices()), s.agent.Tail(30))
	}
}

// waitReadyz waits until the agent pod's /readyz (host network: the
// node's loopback) answers 200 with body, besides the line that says where
// the NVIDIA driver is (a node with GPUs always has it: checked here too).
// Each republication makes it unready until the publication is seen in
// the API server.
func (s *scenario) waitReadyz(body string) {
	s.t.Helper()
	var code int
	var got string
	if waitfor.Until(s.ctx, "/readyz", 10*time.Second, func() bool {
		resp, err := http.Get("http://" + framework.AgentAddr + "/readyz")
		if err != nil {
			s.t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		code, got = resp.StatusCode, string(data)
		var rest []string
		driver := false
		for _, line := range strings.SplitAfter(got, "\n") {
			if strings.HasPrefix(line, "NVIDIA driver root / (fhs layout): NVML ") {
				driver = true
				continue
			}
			rest = append(rest, line)
		}
		return code == http.StatusOK && driver && strings.Join(rest, "") == body
	}) != nil {
		s.t.Errorf("/readyz: %d %q, want 200 and %q", code, got, body)
	}
}

// checkWithdrawn waits until the agent publishes no GPU, and checks that
// it stays ready and says why: /readyz, hwdra_device_plugin_detected of
// source, hwdra_device_plugin_gpus, its log (the round-th time).
func (s *scenario) checkWithdrawn(round int, why, source, timing string) {
	s.t.Helper()
	began := time.Now()
	s.waitGPUDevices(0)
	framework.Timing(s.t, timing, time.Since(began))
	s.waitReadyz("ok\n8 of 8 GPUs not published: NVIDIA's device plugin serves GPUs on this node: " + why + "\n")
	if v, err := framework.AgentMetric(framework.AgentAddr, `hwdra_device_plugin_detected{source="`+source+`"}`); err != nil || v != "1" {
		s.t.Errorf("hwdra_device_plugin_detected{source=%q} = %q (%v), want 1", source, v, err)
	}
	if v, err := framework.AgentMetric(framework.AgentAddr, "hwdra_device_plugin_gpus"); err != nil || v != "8" {
		s.t.Errorf("hwdra_device_plugin_gpus = %q (%v), want 8", v, err)
	}
	s.waitLogged(round, "Leaving GPUs to NVIDIA's device plugin")
	if !strings.Contains(s.agent.Log(), why) {
		s.t.Errorf("the agent's log does not say %q", why)
	}
}

// waitLogged waits until the agent has logged line n times.
func (s *scenario) waitLogged(n int, line string) {
	s.t.Helper()
	if waitfor.Until(s.ctx, "the agent's log", 10*time.Second, func() bool { return strings.Count(s.agent.Log(), line) == n }) != nil {
		s.t.Errorf("the agent logged %q %d times, want %d", line, strings.Count(s.agent.Log(), line), n)
	}
}

// checkRestored waits until the agent publishes the GPU devices it did
// before, and says so (the round-th time).
func (s *scenario) checkRestored(round int, want map[string]bool, timing string) {
	s.t.Helper()
	began := time.Now()
	s.waitGPUDevices(len(want))
	framework.Timing(s.t, timing, time.Since(began))
	for d := range s.gpuDevices() {
		if !want[d] {
			s.t.Errorf("published %s, which was not published before", d)
		}
	}
	s.waitReadyz("ok\n")
	if v, err := framework.AgentMetric(framework.AgentAddr, "hwdra_device_plugin_gpus"); err != nil || v != "0" {
		s.t.Errorf("hwdra_device_plugin_gpus = %q (%v), want 0", v, err)
	}
	s.waitLogged(round, "Publishing every GPU again")
}
