// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"path/filepath"
	"testing"
)

// A worker's paths as its own processes see them: under the root they
// share, whatever the worker's own directory; others unchanged. An
// isolated node's processes see its paths where the tests do.
func TestOnNode(t *testing.T) {
	w := &Node{Root: "/run/e2e/n3", worker: &worker{nodeRoot: "/run/e2e/node"}}
	single := &Node{Root: "/run/e2e/n1"}
	isolated := &Node{Root: "/run/e2e/n2", worker: isolatedWorker("/run/e2e/n2")}
	for _, c := range []struct {
		n        *Node
		in, want string
	}{
		{w, "/run/e2e/n3", "/run/e2e/node"},
		{w, "/run/e2e/n3/kubelet/plugins_registry", "/run/e2e/node/kubelet/plugins_registry"},
		{w, "/run/e2e/n30/x", "/run/e2e/n30/x"},
		{w, "/run/e2e/cp/kubelet-dgx.kubeconfig", "/run/e2e/cp/kubelet-dgx.kubeconfig"},
		{w, "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins"},
		{single, "/run/e2e/n1/cdi", "/run/e2e/n1/cdi"},
		{isolated, "/run/e2e/n2/cdi", "/run/e2e/n2/cdi"},
	} {
		if got := c.n.onNode(c.in); got != c.want {
			t.Errorf("onNode(%s) on root %s = %s, want %s", c.in, c.n.Root, got, c.want)
		}
	}
}

// A run's sweep matches its own workers' cgroups, never those of another
// run going beside it (hwdra-e2e-12 is not hwdra-e2e-123), and the
// machine's kubepods only for a run with a node.
func TestRunCgroupPatterns(t *testing.T) {
	for _, c := range []struct {
		node      bool
		dir       string
		wantMatch bool
	}{
		{false, "/sys/fs/cgroup/memory/hwe2e-12-mig", true},
		{false, "/sys/fs/cgroup/memory/" + isolatedCgroup("hwdra-e2e-12", "/tmp/hwe2e-12-77/n2"), true},
		{false, "/sys/fs/cgroup/memory/" + isolatedCgroup("hwdra-e2e-123", "/tmp/hwe2e-123-77/n2"), false},
		{false, "/sys/fs/cgroup/hwe2e-12-dgx", true},
		{false, "/sys/fs/cgroup/memory/hwe2e-123-mig", false},
		{false, "/sys/fs/cgroup/memory/hwe2e-1-mig", false},
		{false, "/sys/fs/cgroup/memory/kubepods", false},
		{true, "/sys/fs/cgroup/memory/kubepods", true},
		{true, "/sys/fs/cgroup/kubepods", true},
		{true, "/sys/fs/cgroup/memory/hwe2e-123-mig", false},
	} {
		matched := false
		for _, p := range runCgroupPatterns("hwdra-e2e-12", c.node) {
			if ok, err := filepath.Match(p, c.dir); err != nil {
				t.Fatal(err)
			} else if ok {
				matched = true
			}
		}
		if matched != c.wantMatch {
			t.Errorf("run hwdra-e2e-12 (node: %v) sweeps %s: %v, want %v", c.node, c.dir, matched, c.wantMatch)
		}
	}
}

// The kubelet's fixed places as the tests find them: the machine's for
// the machine's node, the node's own for a worker and an isolated node.
func TestNodeFixedPlaces(t *testing.T) {
	machine := &Node{Root: "/run/e2e/n1"}
	isolated := &Node{Root: "/run/e2e/n2", worker: &worker{cgroup: isolatedCgroup("hwdra-e2e-12", "/run/e2e/n2")}}
	for _, c := range []struct {
		n                     *Node
		devicePlugins, memory string
	}{
		{machine, "/var/lib/kubelet/device-plugins", "/sys/fs/cgroup/memory/kubepods"},
		{isolated, "/run/e2e/n2/device-plugins", "/sys/fs/cgroup/memory/hwe2e-12-n2/kubepods"},
	} {
		if got := c.n.KubeletDevicePluginDir(); got != c.devicePlugins {
			t.Errorf("node %s: device plugins at %s, want %s", c.n.Root, got, c.devicePlugins)
		}
		if got := c.n.kubepodsDir("memory"); got != c.memory {
			t.Errorf("node %s: kubepods at %s, want %s", c.n.Root, got, c.memory)
		}
	}
}
