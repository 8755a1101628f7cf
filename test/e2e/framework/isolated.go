// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// An isolated node is a node of a run of isolated nodes (EnvIsolated):
// the shared node or a dedicated one (Shared, New), running beside a run
// with the machine's node, so it must leave alone what that node's
// kubelet owns on the machine. It stays in its run's network namespace
// (addresses, ports, the registry and the bridge are the run's own, as
// any node's are) and gets a cluster worker's two other walls:
//
//   - a mount namespace in which the kubelet's fixed device-plugin
//     directory (DevicePluginDir, which every kubelet empties when it
//     starts) is a directory of its own, Root/device-plugins; every
//     process of the node enters it (newProcess), the agents the tests
//     start included;
//   - a cgroup root of its own, hwe2e-<pid>-<root's name> (its run's
//     sweep finds it by the prefix): a kubelet removes the pod cgroups
//     it does not know under its root, and the machine's node's root is
//     the machine's.
//
// Its processes see its Root where the tests do, and mounts the tests
// make under Root reach them (a slave mount namespace).

// isolatedWorker is what makes the node with the given root isolated.
func isolatedWorker(root string) *worker {
	return &worker{cgroup: isolatedCgroup(os.Getenv(envNetns), root)}
}

// isolatedCgroup names the cgroup root of the node with the given root
// in the run whose network namespace is ns.
func isolatedCgroup(ns, root string) string {
	return workerCgroupPrefix + strings.TrimPrefix(ns, "hwdra-e2e-") + "-" + filepath.Base(root)
}

// isolatedHolderScript makes an isolated node's mount namespace: Root
// shared (the kubelet's and the agent pod's HostToContainer mounts need
// it) and its own device-plugin directory ($1 Root, $3 DevicePluginDir).
const isolatedHolderScript = `mount --make-rshared "$1" &&
mount --bind "$1/device-plugins" "$3" && echo ready && exec sleep infinity`

// isolate makes the node's cgroup root and mount namespace, before any
// of its processes starts.
func (n *Node) isolate() error {
	for _, dir := range []string{DevicePluginDir, filepath.Join(n.Root, "device-plugins")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if err := n.worker.makeCgroup(); err != nil {
		return fmt.Errorf("isolated node %s: %w", n.Name, err)
	}
	if err := n.worker.startHolder(n.Root, isolatedHolderScript); err != nil {
		return fmt.Errorf("isolated node %s: %w", n.Name, err)
	}
	return nil
}
