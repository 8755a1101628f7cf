// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/hwdra/hwdra/internal/waitfor"
)

// containerdConfig is containerd 2.x's configuration (version 4) with every
// path under the node's root. Notable settings: restrict_oom_score_adj (no
// CAP_SYS_RESOURCE on these machines), cdi_spec_dirs = the agent's --cdi-dir,
// NRI on with its socket in the root and its default validator on (a pod
// annotated with required plugins gets no container while one is missing:
// what docs/operator-guide.md asks for VF pods), the local sandbox image
// pinned.
const containerdConfig = `version = 4
root = '@ROOT@/ctrd/root'
state = '@ROOT@/ctrd/state'
imports = []

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '@ROOT@/ctrd/certs.d'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '@PAUSE@'

  [plugins.'io.containerd.cri.v1.runtime']
    cdi_spec_dirs = ['@CDI@']
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = true
    tolerate_missing_hugetlb_controller = true
    disable_hugetlb_controller = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        sandboxer = 'podsandbox'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '@RUNC@'
          Root = '@ROOT@/ctrd/runc'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['@BIN@']
      conf_dir = '@ROOT@/cni/net.d'
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'

  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = '@NRI@'
    plugin_path = '@ROOT@/nri/plugins'
    plugin_config_path = '@ROOT@/nri/conf.d'
    disable_connections = false
    [plugins.'io.containerd.nri.v1.nri'.default_validator]
      enable = true

  [plugins.'io.containerd.server.v1.grpc']
    address = '@ROOT@/ctrd/containerd.sock'

  [plugins.'io.containerd.server.v1.ttrpc']
    address = '@ROOT@/ctrd/containerd.sock.ttrpc'

  [plugins.'io.containerd.server.v1.debug']
    address = ''

  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = '@ROOT@/ctrd/s'

  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = '@ROOT@/ctrd/image-verifier'

  [plugins.'io.containerd.internal.v1.opt']
    path = '@ROOT@/ctrd/opt'

[cgroup]
  path = ''
`

// cniConfig is a plain bridge on the node's bridge, addresses from the pod
// CIDR. No masquerading and no default route: pods talk only to the node.
const cniConfig = `{
  "cniVersion": "1.0.0",
  "name": "e2e-net",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "@BRIDGE@",
      "isGateway": false,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "@POD_CIDR@"}]],
        "dataDir": "@ROOT@/cni/ipam"
      }
    }
  ]
}
`

// expand fills in a configuration with the node's paths as its processes
// see them.
func (n *Node) expand(tmpl string) string {
	bridge, podCIDR := bridgeName, PodCIDR
	if n.ownNetwork() {
		bridge, podCIDR = workerBridge, n.worker.podCIDR()
	}
	return strings.NewReplacer(
		"@ROOT@", n.onNode(n.Root), "@BIN@", binDir(), "@RUNC@", runcPath,
		"@CDI@", n.onNode(n.CDIDir), "@NRI@", n.onNode(n.NRISocket), "@PAUSE@", PauseImage,
		"@BRIDGE@", bridge, "@POD_CIDR@", podCIDR,
	).Replace(tmpl)
}

// registryHosts is containerd's host configuration of the suite's
// registry (registry.go) as the workers of a cluster reach it: plain
// HTTP, as containerd assumes only for loopback.
const registryHosts = `server = "http://@REGISTRY@"

[host."http://@REGISTRY@"]
  capabilities = ["pull", "resolve"]
`

// ContainerdSocket is the CRI endpoint.
func (n *Node) ContainerdSocket() string { return filepath.Join(n.Root, "ctrd", "containerd.sock") }

// startContainerd starts containerd and imports the test images.
func (n *Node) startContainerd(ctx context.Context, images []string) error {
	for _, d := range []string{"ctrd", "cni/net.d", "cni/ipam", "nri/plugins", "nri/conf.d"} {
		if err := os.MkdirAll(filepath.Join(n.Root, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(n.CDIDir, 0o755); err != nil {
		return err
	}
	cfg := filepath.Join(n.Root, "ctrd", "config.toml")
	if err := os.WriteFile(cfg, []byte(n.expand(containerdConfig)), 0o644); err != nil {
		return err
	}
	hosts := filepath.Join(n.Root, "ctrd", "certs.d", workerRegistryAddr)
	if err := os.MkdirAll(hosts, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(hosts, "hosts.toml"), []byte(strings.ReplaceAll(registryHosts, "@REGISTRY@", workerRegistryAddr)), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.Root, "cni/net.d/10-bridge.conflist"), []byte(n.expand(cniConfig)), 0o644); err != nil {
		return err
	}
	n.Containerd = n.newProcess("containerd", bin("containerd"), "--config="+n.onNode(cfg), "--log-level=info")
	// containerd finds its shim through PATH: ours (2.x) must win over any
	// distribution's 1.x shim.
	n.Containerd.Env = []string{"PATH=" + binDir() + ":" + os.Getenv("PATH")}
	if err := n.Containerd.Start(); err != nil {
		return err
	}
	if err := waitfor.Check(ctx, "containerd up", 30*time.Second, func() error {
		err := n.ctr(ctx, "version")
		if err != nil && !n.Containerd.Running() {
			return waitfor.Stop(fmt.Errorf("exited: %w", err))
		}
		return err
	}); err != nil {
		return fmt.Errorf("%w\n%s", err, n.Containerd.Tail(30))
	}
	errs := make(chan error, len(images))
	for _, archive := range images {
		go func() { errs <- n.ctr(ctx, "images", "import", "--platform", "linux/amd64", archive) }()
	}
	for range images {
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}

// ctr runs containerd's CLI against this node's containerd, in the CRI
// namespace.
func (n *Node) ctr(ctx context.Context, args ...string) error {
	full := append([]string{"--address", n.ContainerdSocket(), "--namespace", "k8s.io"}, args...)
	out, err := exec.CommandContext(ctx, bin("ctr"), full...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %v: %v: %s", args, err, out)
	}
	return nil
}
