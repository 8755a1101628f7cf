// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package deviceplugin tells whether NVIDIA's Kubernetes device plugin
// (k8s-device-plugin) serves GPUs on this node, from what the kubelet
// shows of it: the plugin's socket in the kubelet's device-plugin
// directory, and the plugin's extended resources in the node's status.
// While it does, the agent leaves the GPUs to it
// (config.AgentConfig.OwnGPUs): a GPU offered both ways would be handed
// to two pods. Both are watched (inotify on the directory, an informer
// on this one Node), not polled.
package deviceplugin

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Signal is one sign that the device plugin serves GPUs on the node.
type Signal struct {
	// Source is SourceSocket or SourceNode.
	Source string
	// What is the socket's path, or the node's resource and count
	// ("nvidia.com/gpu=8").
	What string
}

// Sources of signals.
const (
	SourceSocket = "socket"
	SourceNode   = "node"
)

func (s Signal) String() string {
	if s.Source == SourceNode {
		return "the node advertises " + s.What
	}
	return "its socket " + s.What
}

// socketPrefix, socketSuffix: NVIDIA's device plugin serves the resource
// nvidia.com/<name> on <device-plugin dir>/nvidia-<name>.sock
// (k8s-device-plugin's NewNvidiaDevicePlugin: pluginapi.DevicePluginPath
// + "nvidia-" + name + ".sock").
const (
	socketPrefix   = "nvidia-"
	socketSuffix   = ".sock"
	resourceDomain = "nvidia.com/"
)

// FromSockets are the signals among the entries of the kubelet's
// device-plugin directory dir: each socket of NVIDIA's device plugin for
// a resource that is the plugin's GPUs (resource, config's
// DevicePluginResource). The kubelet removes every socket in the
// directory when it starts (its device manager's CleanupPluginDirectory)
// and the plugin removes its own when it stops, so a socket there is a
// plugin that runs or is restarting; plain files (the kubelet's
// checkpoint) are not sockets.
func FromSockets(dir string, entries []fs.DirEntry, resource func(string) bool) []Signal {
	var out []Signal
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), socketPrefix)
		if !ok || e.Type()&fs.ModeSocket == 0 {
			continue
		}
		if name, ok = strings.CutSuffix(name, socketSuffix); !ok || name == "" {
			continue
		}
		if resource(resourceDomain + name) {
			out = append(out, Signal{Source: SourceSocket, What: filepath.Join(dir, e.Name())})
		}
	}
	return out
}

// FromNode are the signals in a node's status: each of the plugin's
// resources (resource) with capacity or allocatable above zero.
//
// Capacity counts, not only allocatable, which is what the scheduler
// compares (k8s.io/kubernetes pkg/scheduler/framework/plugins/
// dynamicresources filterExtendedResources: a node whose allocatable is
// 0 gets the resource from DRA): when a device plugin stops, the kubelet
// marks its devices unhealthy (allocatable 0 at once) but keeps them in
// capacity for 5 minutes (pkg/kubelet/cm/devicemanager
// endpointStopGracePeriod), then sets the capacity to 0
// (pkg/kubelet/nodestatus MachineInfo). Waiting for that keeps the GPUs
// off hwdra while the plugin restarts (an upgrade, a crash).
func FromNode(node *v1.Node, resource func(string) bool) []Signal {
	if node == nil {
		return nil
	}
	count := map[v1.ResourceName]int64{}
	for _, list := range []v1.ResourceList{node.Status.Capacity, node.Status.Allocatable} {
		for name, q := range list {
			if v := q.Value(); v > count[name] && resource(string(name)) {
				count[name] = v
			}
		}
	}
	var out []Signal
	for name, n := range count {
		if n > 0 {
			out = append(out, Signal{Source: SourceNode, What: fmt.Sprintf("%s=%d", name, n)})
		}
	}
	sortSignals(out)
	return out
}

func sortSignals(s []Signal) {
	sort.Slice(s, func(i, j int) bool {
		if s[i].Source != s[j].Source {
			return s[i].Source > s[j].Source // sockets first
		}
		return s[i].What < s[j].What
	})
}

// describe is each signal's String.
func describe(signals []Signal) []string {
	out := make([]string, 0, len(signals))
	for _, s := range signals {
		out = append(out, s.String())
	}
	return out
}
