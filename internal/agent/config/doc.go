// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package config loads the agent's configuration file, an AgentConfig of
// config.hwdra.io/v1alpha1 (package api/config/v1alpha1 says what each
// field means; api/config/v1alpha1/example.yaml is an example), and resolves it on a
// node: which SR-IOV PFs the agent offers, in which mode and under which
// bandwidth policy (Resolve: NICOffer, Skip), how device faults are
// judged and tainted (HealthPolicy), which GPUs the agent publishes
// beside NVIDIA's device plugin (DevicePluginResource, OwnGPUs), and which
// MIG profiles it offers and whether it changes GPU settings (GPUPolicy),
// what claims may set on the VFs of each PF (VFPolicy) and whether VFIO
// groups without an IOMMU are handed out (AllowsUnsafeNoIOMMU).
//
// Decoding is strict and all-or-nothing (api.Decode): unknown fields,
// wrong types and bad values are errors that name the file and the field
// ("config /etc/hwdra/config.yaml: nics[1].bandwidth.step: Invalid value:
// "0": must be > 0"), and a file with any error yields no configuration.
//
// Without a file (no --config), or a file without nics, every PF with VFs
// is offered in shared mode with the built-in bandwidth policy (default
// 10G, minimum 1G, step 1G), except the PFs that carry a default route. A
// file's section left out keeps its defaults; an empty nics list is
// refused (it would offer no PF: [{mode: disabled}] says so on purpose).
package config
