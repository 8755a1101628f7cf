// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"
)

// The agent's chart and image in the suite: the chart deploy/helm/hwdra
// and the agent image built by hack/build-image.sh, pushed by
// hack/push.sh to the suite's registry (registry.go) and installed from
// there with the helm CLI built from its Go module (hack/build-helm.sh).
// Two versions of the same source are built (their binaries differ in
// their version string), for the rolling update from one to the other:
// the first as the product ships (an index of linux/amd64 and
// linux/arm64), the second for this machine's platform only.
const (
	AgentImageRepository = registryPath + "/hwdra"
	AgentImageTag        = "0.1.0-e2e.1"
	AgentImageTagNext    = "0.1.0-e2e.2"
	// ReleaseName is the chart's release in AgentNamespace.
	ReleaseName = "hwdra"
	// AgentPodLabel on the node lets the chart's DaemonSet run there;
	// without it the node runs no agent pod (the suite's process agents
	// use the same RBAC).
	AgentPodLabel = "hwdra.io/e2e-agent"
)

var (
	agentImagesOnce sync.Once
	agentImages     []string
	agentImagesErr  error
)

// buildAgentImages runs hack/build-image.sh for both tags into dir, with
// the hardware simulator in (the product image has none): the archives of
// AgentImageTag and AgentImageTagNext, in that order. The two builds run
// side by side (their own directories under dir): the suite's first
// node waits for them.
func buildAgentImages(dir string) ([]string, error) {
	agentImagesOnce.Do(func() {
		if p := os.Getenv(envAgentImages); p != "" {
			agentImages = strings.Split(p, ",")
			return
		}
		root, err := moduleRoot()
		if err != nil {
			agentImagesErr = err
			return
		}
		builds := []struct{ tag, platforms string }{
			{AgentImageTag, "linux/amd64,linux/arm64"},
			{AgentImageTagNext, "linux/" + runtime.GOARCH},
		}
		archives := make([]string, len(builds))
		errs := make([]error, len(builds))
		var wg sync.WaitGroup
		for i, b := range builds {
			wg.Go(func() { archives[i], errs[i] = buildAgentImage(root, dir, b.tag, b.platforms) })
		}
		wg.Wait()
		if agentImagesErr = errors.Join(errs...); agentImagesErr == nil {
			agentImages = archives
		}
	})
	return agentImages, agentImagesErr
}

// buildAgentImage runs hack/build-image.sh for one tag and returns the
// archive it wrote.
func buildAgentImage(root, dir, tag, platforms string) (string, error) {
	cmd := exec.Command(filepath.Join(root, "hack", "build-image.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "HWDRA_IMAGE_REPOSITORY="+AgentImageRepository, "HWDRA_IMAGE_TAG="+tag, "HWDRA_IMAGE_OUTPUT="+dir,
		"HWDRA_IMAGE_PLATFORMS="+platforms,
		// The suite's nodes run on mock hardware: the test image keeps the simulator.
		"HWDRA_IMAGE_SIMULATOR=1")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/build-image.sh (tag %s): %v: %s", tag, err, exitStderr(err))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// buildHelm runs hack/build-helm.sh (cached per version).
func buildHelm() (string, error) {
	helmOnce.Do(func() {
		if p := os.Getenv(envHelm); p != "" {
			helmPath = p
			return
		}
		root, err := moduleRoot()
		if err != nil {
			helmErr = err
			return
		}
		cmd := exec.Command(filepath.Join(root, "hack", "build-helm.sh"))
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			helmErr = fmt.Errorf("hack/build-helm.sh: %v: %s", err, exitStderr(err))
			return
		}
		helmPath = strings.TrimSpace(string(out))
	})
	return helmPath, helmErr
}

func exitStderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

// ChartDir is the chart's directory.
func ChartDir() (string, error) {
	dir, err := DeployDir()
	return filepath.Join(dir, "helm", "hwdra"), err
}

// Helm runs the helm CLI against this node as the cluster admin, with
// helm's own files under the node's root.
func (n *Node) Helm(ctx context.Context, args ...string) (string, error) {
	helm, err := buildHelm()
	if err != nil {
		return "", err
	}
	home := filepath.Join(n.Root, "helm")
	cmd := exec.CommandContext(ctx, helm, append(args, "--kubeconfig", n.AdminKubeconfig())...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"), "HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// AgentValues are the chart's values for this node: its kubelet, CDI,
// NRI and netns paths, the suite's image, a state directory of the
// pod's own, the API server on loopback (no kube-proxy: the pod has host
// networking), the mock's veth stand-ins, and the pod only where the node
// has AgentPodLabel. Tests change hardware, image and environment.
func (n *Node) AgentValues(hardware string) map[string]any {
	repo, apiHost := AgentImageRepository, "127.0.0.1"
	if n.ownNetwork() {
		repo, apiHost = workerRegistryAddr+"/e2e/hwdra", NodeIP
	}
	return map[string]any{
		"image":          map[string]any{"repository": repo, "tag": AgentImageTag, "pullPolicy": "IfNotPresent"},
		"hardware":       hardware,
		"kubeletRootDir": n.onNode(n.KubeletRoot()),
		"cdiDir":         n.onNode(n.CDIDir),
		"nriSocket":      n.onNode(n.NRISocket),
		"podNetnsDir":    n.onNode(n.NetnsDir()),
		// An explicit root: the chart's default mounts the node's / with
		// HostToContainer propagation, which needs / shared (as on a
		// systemd node); this machine's / may be private. On mock
		// hardware the agent does not look there anyway.
		"nvidiaDriverRoot": n.onNode(filepath.Join(n.Root, "driver-root")),
		"stateDir":         n.onNode(n.AgentPodStateDir()),
		"nodeSelector":     map[string]any{AgentPodLabel: "true"},
		"logVerbosity":     2,
		"extraEnv": []any{
			map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": apiHost},
			map[string]any{"name": "KUBERNETES_SERVICE_PORT", "value": fmt.Sprint(apiserverPort)},
			map[string]any{"name": "HWDRA_MOCK_VETH", "value": "1"},
		},
	}
}

// AgentPodStateDir is the agent pod's --state-dir on the node.
func (n *Node) AgentPodStateDir() string { return filepath.Join(n.Root, "agent-pod-state") }

// NetnsDir is where containerd mounts pods' network namespaces
// (netns_mounts_under_state_dir: under the CRI plugin's state directory).
func (n *Node) NetnsDir() string {
	return filepath.Join(n.Root, "ctrd", "state", "io.containerd.grpc.v1.cri", "netns")
}

// InstallChart installs or upgrades the chart with values, from the
// suite's registry, into the agent's namespace with its Pod Security
// label.
func (n *Node) InstallChart(ctx context.Context, values map[string]any) error {
	if err := n.pushAgentImages(ctx); err != nil {
		return err
	}
	if err := n.ensureAgentNamespace(ctx); err != nil {
		return fmt.Errorf("namespace %s: %w", AgentNamespace, err)
	}
	data, err := yaml.Marshal(values)
	if err != nil {
		return err
	}
	file := filepath.Join(n.Root, "helm", "values.yaml")
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		return err
	}
	_, err = n.Helm(ctx, "upgrade", "--install", ReleaseName, AgentChart, "--version", AgentImageTag, "--plain-http",
		"--namespace", AgentNamespace, "-f", file)
	return err
}

// RenderChart renders the chart with values (nil: its defaults).
func (n *Node) RenderChart(ctx context.Context, values map[string]any) (string, error) {
	chart, err := ChartDir()
	if err != nil {
		return "", err
	}
	args := []string{"template", ReleaseName, chart, "--namespace", AgentNamespace}
	if values != nil {
		data, err := yaml.Marshal(values)
		if err != nil {
			return "", err
		}
		file := filepath.Join(n.Root, "helm", "render-values.yaml")
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(file, data, 0o644); err != nil {
			return "", err
		}
		args = append(args, "-f", file)
	}
	return n.Helm(ctx, args...)
}
