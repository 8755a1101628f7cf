// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Kubelet ports inside the namespace (the apiserver reaches the node IP for
// logs; healthz stays on loopback).
const (
	kubeletPort        = 10250
	kubeletHealthzPort = 10248
)

// kubeletConfig is the KubeletConfiguration for this machine's kind:
// cgroup v1 (hybrid) without systemd, no swap accounting, no iptables, no
// CAP_SYS_RESOURCE; everything it writes under its root where it lets us.
func (n *Node) kubeletConfig() map[string]any {
	cfg := map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"failCgroupV1":             false,
		"failSwapOn":               false,
		"cgroupDriver":             "cgroupfs",
		"cgroupsPerQOS":            true,
		"enforceNodeAllocatable":   []string{"pods"},
		"protectKernelDefaults":    false,
		"containerRuntimeEndpoint": "unix://" + n.onNode(n.ContainerdSocket()),
		"podLogsDir":               n.onNode(filepath.Join(n.Root, "pod-logs")),
		"address":                  n.IP(),
		"port":                     kubeletPort,
		"readOnlyPort":             0,
		"healthzBindAddress":       "127.0.0.1",
		"healthzPort":              kubeletHealthzPort,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": true},
			"webhook":   map[string]any{"enabled": false},
		},
		"authorization":               map[string]any{"mode": "AlwaysAllow"},
		"registerNode":                true,
		"serializeImagePulls":         false,
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard": map[string]string{
			"memory.available": "100Mi", "nodefs.available": "1%",
			"imagefs.available": "1%", "nodefs.inodesFree": "1%",
		},
		"resolvConf":             "",
		"clusterDomain":          "cluster.local",
		"makeIPTablesUtilChains": false,
		"volumePluginDir":        n.onNode(filepath.Join(n.Root, "kubelet-volume-plugins")),
		"featureGates":           n.Options.FeatureGates,
		// Faster status round trips than production defaults: tests wait
		// on them.
		"nodeStatusUpdateFrequency": "2s",
		"syncFrequency":             "5s",
	}
	if n.worker != nil {
		cfg["cgroupRoot"] = "/" + n.worker.cgroup
	}
	return cfg
}

// DevicePluginDir is the kubelet's device-plugin directory: fixed in the
// kubelet (k8s.io/kubelet pkg/apis/deviceplugin/v1beta1 DevicePluginPath),
// whatever its --root-dir, so on the machine's own /var/lib/kubelet; the
// chart's devicePluginDir default.
const DevicePluginDir = "/var/lib/kubelet/device-plugins"

// KubeletDevicePluginDir is the node's DevicePluginDir as the tests see
// it: a cluster's worker and an isolated node have a directory of their
// own there (their mount namespace's), the machine's node the machine's.
func (n *Node) KubeletDevicePluginDir() string {
	if n.worker != nil {
		return filepath.Join(n.Root, "device-plugins")
	}
	return DevicePluginDir
}

// kubepodsDir is the node's kubelet's top pod cgroup in the hierarchy
// (e.g. "memory"): under its own cgroupRoot on a cluster's worker and
// an isolated node.
func (n *Node) kubepodsDir(hierarchy string) string {
	dir := filepath.Join("/sys/fs/cgroup", hierarchy)
	if n.worker != nil {
		dir = filepath.Join(dir, n.worker.cgroup)
	}
	return filepath.Join(dir, "kubepods")
}

// KubeletRoot is the kubelet's --root-dir. Its DRA paths are
// <root>/plugins_registry (registration sockets) and <root>/plugins/<driver>.
func (n *Node) KubeletRoot() string { return filepath.Join(n.Root, "kubelet") }

// RegistrarDir is where DRA drivers put their registration socket.
func (n *Node) RegistrarDir() string { return filepath.Join(n.KubeletRoot(), "plugins_registry") }

// PluginsDir is the parent of each driver's plugin data directory.
func (n *Node) PluginsDir() string { return filepath.Join(n.KubeletRoot(), "plugins") }

func (n *Node) startKubelet(ctx context.Context) error {
	data, err := yaml.Marshal(n.kubeletConfig())
	if err != nil {
		return err
	}
	cfg := filepath.Join(n.Root, "kubelet-config.yaml")
	if err := os.WriteFile(cfg, data, 0o644); err != nil {
		return err
	}
	n.Kubelet = n.newProcess("kubelet", bin("kubelet"),
		"--config="+n.onNode(cfg),
		"--kubeconfig="+n.kubeconfigs["kubelet"],
		"--root-dir="+n.onNode(n.KubeletRoot()),
		"--cert-dir="+n.onNode(filepath.Join(n.KubeletRoot(), "pki")),
		"--node-ip="+n.IP(),
		"--hostname-override="+n.Name,
		"--v=2")
	n.Kubelet.Env = []string{"PATH=" + binDir() + ":" + os.Getenv("PATH")}
	return n.Kubelet.Start()
}

// WaitNodeReady waits until the node reports Ready.
func (n *Node) WaitNodeReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		node, err := n.Admin.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					return nil
				}
			}
		}
		if !n.Kubelet.Running() {
			return fmt.Errorf("kubelet exited: %v\n%s", n.Kubelet.ExitErr(), n.Kubelet.Tail(40))
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return fmt.Errorf("node %s not Ready: %w\n%s", n.Name, err, n.Kubelet.Tail(40))
		}
	}
}
