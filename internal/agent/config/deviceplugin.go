// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"slices"
	"strings"

	configv1alpha1 "github.com/hwdra/hwdra/api/config/v1alpha1"
	"github.com/hwdra/hwdra/internal/hw"
)

// devicePlugin is the validated devicePlugin section.
type devicePlugin struct {
	names, prefixes []string
	// owned are the GPUs the agent owns on a node split on purpose; nil:
	// every GPU, none while the device plugin serves.
	owned *configv1alpha1.GPUSelector
}

func compileDevicePlugin(d *configv1alpha1.DevicePluginConfig) devicePlugin {
	resources := configv1alpha1.DefaultDevicePluginResources
	var out devicePlugin
	if d != nil {
		resources, out.owned = d.Resources, d.OwnedGPUs
	}
	for _, r := range resources {
		if p, ok := strings.CutSuffix(r, "*"); ok {
			out.prefixes = append(out.prefixes, p)
		} else {
			out.names = append(out.names, r)
		}
	}
	return out
}

// DevicePluginResource reports whether an extended resource is one by
// which NVIDIA's device plugin offers GPUs (devicePlugin.resources).
func (c *AgentConfig) DevicePluginResource(name string) bool {
	if slices.Contains(c.devicePlugin.names, name) {
		return true
	}
	return slices.ContainsFunc(c.devicePlugin.prefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// OwnGPUs splits gpus into those the agent publishes and those it leaves
// to NVIDIA's device plugin, given whether the device plugin serves GPUs
// on the node now, and says why it leaves any. Pure. With
// devicePlugin.ownedGPUs the split is theirs whatever the device plugin
// does; without, the agent owns every GPU while the device plugin is
// away, and none while it serves: one GPU offered by both would be handed
// to two pods.
func (c *AgentConfig) OwnGPUs(gpus []hw.GPU, devicePluginServes bool) (own, left []hw.GPU, why string) {
	sel := c.devicePlugin.owned
	switch {
	case sel != nil:
		why = "devicePlugin.ownedGPUs leaves them to NVIDIA's device plugin"
	case devicePluginServes:
		why = "NVIDIA's device plugin serves GPUs on this node"
	}
	for _, g := range gpus {
		mine := !devicePluginServes
		if sel != nil {
			mine = slices.Contains(sel.PCIAddresses, g.PCIBusID) || slices.Contains(sel.UUIDs, g.UUID)
		}
		if mine {
			own = append(own, g)
		} else {
			left = append(left, g)
		}
	}
	if len(left) == 0 {
		why = ""
	}
	return own, left, why
}
