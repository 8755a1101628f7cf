// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import "testing"

// A worker's paths as its own processes see them: under the root they
// share, whatever the worker's own directory; others unchanged.
func TestOnNode(t *testing.T) {
	w := &Node{Root: "/run/e2e/n3", worker: &worker{nodeRoot: "/run/e2e/node"}}
	single := &Node{Root: "/run/e2e/n1"}
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
	} {
		if got := c.n.onNode(c.in); got != c.want {
			t.Errorf("onNode(%s) on root %s = %s, want %s", c.in, c.n.Root, got, c.want)
		}
	}
}
