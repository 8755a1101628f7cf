// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// registerPlugins does the kubelet's part of a plugin registration for
// each driver: GetInfo, then NotifyRegistrationStatus.
func (a *testAgent) registerPlugins(drivers ...string) {
	a.t.Helper()
	ctx := context.Background()
	for _, d := range drivers {
		c := registerapi.NewRegistrationClient(a.dial(filepath.Join(a.dir, "registry", d+"-reg.sock")))
		if _, err := c.GetInfo(ctx, &registerapi.InfoRequest{}); err != nil {
			a.t.Fatal(err)
		}
		if _, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
			a.t.Fatal(err)
		}
	}
}

// TestLeavesGPUsToTheDevicePlugin: a socket of NVIDIA's device plugin in
// the kubelet's device-plugin directory makes the agent withdraw its GPU
// devices (the NIC's stay); it stays ready, and /readyz, the metrics and
// the log say why. When the socket goes the GPUs come back.
func TestLeavesGPUsToTheDevicePlugin(t *testing.T) {
	dpDir := t.TempDir()
	a := startAgentWith(t, Options{Hardware: "mock:" + writeProfile(t, "gpus:\n- model: h100-80gb\n  count: 2\nnics:\n- model: cx7\n  count: 1\n  vfs: 4\n"), DevicePluginDir: dpDir})
	gpus := len(deviceNamesOf(a.slices(device.GPUDriver, nil)))
	a.slices(device.NICDriver, nil)
	a.registerPlugins(device.GPUDriver, device.NICDriver)
	waitfor.True(t, "ready", 30*time.Second, func() bool { code, _ := probe(t, a.opts.MetricsAddress, "/readyz"); return code == http.StatusOK })

	sock := filepath.Join(dpDir, "nvidia-gpu.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	waitfor.True(t, "GPU slices withdrawn", 30*time.Second, func() bool { return a.storedDevices(device.GPUDriver) == 0 })
	want := "2 of 2 GPUs not published: NVIDIA's device plugin serves GPUs on this node: its socket " + sock
	// It says too where the NVIDIA driver is: the mock's, found as on a
	// host.
	waitfor.True(t, "/readyz naming the device plugin and the driver", 30*time.Second, func() bool {
		code, body := probe(t, a.opts.MetricsAddress, "/readyz")
		return code == http.StatusOK && strings.HasPrefix(body, "ok\nNVIDIA driver root / (fhs layout): NVML /") &&
			strings.Contains(body, "/host/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1, programs in /") && strings.HasSuffix(body, "\n"+want+"\n")
	})

	if got := a.metric(`hwdra_device_plugin_detected{source="socket"}`); got != "1" {
		t.Errorf("hwdra_device_plugin_detected{source=socket} %q, want 1", got)
	}
	if got := a.metric("hwdra_device_plugin_gpus"); got != "2" {
		t.Errorf("hwdra_device_plugin_gpus %q, want 2", got)
	}
	if a.storedDevices(device.NICDriver) == 0 {
		t.Error("the NIC's devices went with the GPUs")
	}

	l.Close()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("the listener left its socket: %v", err)
	}
	waitfor.True(t, "GPU slices back", 30*time.Second, func() bool { return a.storedDevices(device.GPUDriver) == gpus })
	waitfor.True(t, "/readyz ok with the driver only", 30*time.Second, func() bool {
		code, body := probe(t, a.opts.MetricsAddress, "/readyz")
		return code == http.StatusOK && strings.HasPrefix(body, "ok\nNVIDIA driver root /") && strings.Count(body, "\n") == 2
	})

	if got := a.metric(`hwdra_device_plugin_detected{source="socket"}`); got != "0" {
		t.Errorf("hwdra_device_plugin_detected{source=socket} %q, want 0", got)
	}
	if got := a.metric("hwdra_device_plugin_gpus"); got != "0" {
		t.Errorf("hwdra_device_plugin_gpus %q, want 0", got)
	}
}

func deviceNamesOf(ss []*resourceapi.ResourceSlice) []string {
	var out []string
	for _, s := range ss {
		for _, d := range s.Spec.Devices {
			out = append(out, d.Name)
		}
	}
	return out
}

// storedDevices counts the driver's devices in the API server.
func (a *testAgent) storedDevices(driver string) int {
	a.t.Helper()
	list, err := a.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		a.t.Fatal(err)
	}
	n := 0
	for _, s := range list.Items {
		if s.Spec.Driver == driver {
			n += len(s.Spec.Devices)
		}
	}
	return n
}
