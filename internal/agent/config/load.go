// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"os"

	"github.com/hwdra/hwdra/api"
	configv1alpha1 "github.com/hwdra/hwdra/api/config/v1alpha1"
)

// Load reads a configuration file. An empty path means no file:
// Default().
func Load(path string) (*AgentConfig, error) {
	if path == "" {
		return Default(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes, defaults and validates a file's content (api.Decode).
// Any error means no configuration: nothing is used from a half-valid
// file.
func Parse(data []byte) (*AgentConfig, error) {
	obj, err := api.Decode(data)
	if err != nil {
		return nil, err
	}
	file, ok := obj.(*configv1alpha1.AgentConfig)
	if !ok {
		gvk := obj.GetObjectKind().GroupVersionKind()
		return nil, fmt.Errorf("kind %s (%s) is no agent configuration: want kind AgentConfig, apiVersion %s",
			gvk.Kind, gvk.GroupVersion(), configv1alpha1.GroupVersion)
	}
	return compile(file), nil
}

// Default is the configuration without a file: every PF with VFs, shared,
// with DefaultBandwidth; default-route PFs stay out.
func Default() *AgentConfig {
	file := &configv1alpha1.AgentConfig{}
	file.Default()
	return compile(file)
}

// rule is a validated NICRule.
type rule struct {
	index     int
	sel       configv1alpha1.PFSelector
	mode      Mode
	bandwidth BandwidthPolicy
}

// compile turns a defaulted, valid file into rules, a health policy, a
// GPU policy and the device plugin's share of the node. A section the
// file leaves out keeps its defaults: without nics, the built-in rule
// (index -1) offers every PF with VFs, shared, with the built-in policy,
// as without a file.
func compile(file *configv1alpha1.AgentConfig) *AgentConfig {
	c := &AgentConfig{
		health:       healthPolicy(file.Health),
		gpu:          gpuPolicy(file.GPUs),
		devicePlugin: compileDevicePlugin(file.DevicePlugin),
		noIOMMU:      file.VFIO != nil && file.VFIO.AllowUnsafeNoIOMMU,
	}
	c.vfDefault, c.vfRules = compileVFPolicy(file.VFPolicy)
	if file.NICs == nil {
		c.rules = []rule{{index: -1, mode: ModeShared, bandwidth: DefaultBandwidth}}
	}
	for i, n := range file.NICs {
		r := rule{index: i, sel: n.Select, mode: n.Mode, bandwidth: DefaultBandwidth}
		if n.Mode == ModeShared {
			r.bandwidth = BandwidthPolicy{DefaultMbps: mbps(n.Bandwidth.Default), MinimumMbps: mbps(n.Bandwidth.Minimum), StepMbps: mbps(n.Bandwidth.Step)}
		}
		c.rules = append(c.rules, r)
	}
	return c
}

// mbps reads a validated bandwidth value.
func mbps(s configv1alpha1.Quantity) int {
	v, err := configv1alpha1.Mbps(s)
	if err != nil {
		panic(fmt.Sprintf("config: bandwidth %q passed validation: %v", s, err))
	}
	return v
}
