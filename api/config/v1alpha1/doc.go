// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package v1alpha1 is the agent's configuration file, AgentConfig in
// config.hwdra.io/v1alpha1 (hwdra agent --config): which SR-IOV PFs the
// agent offers, in which mode, with which bandwidth policy, how device
// faults are judged and tainted, which GPUs the agent leaves to NVIDIA's
// device plugin, which MIG profiles it offers, whether it changes GPU
// settings, what claims may set on their VFs and whether VFIO groups
// without an IOMMU are handed out.
//
//	apiVersion: config.hwdra.io/v1alpha1
//	kind: AgentConfig
//	nics:
//	- select:                 # all given fields must match; a list matches any entry
//	    names: [ens1f0np0]    # PF netdev names
//	    pciAddresses: ["0000:17:00.0"]
//	    vendorIDs: ["15b3"]   # quoted hex
//	    deviceIDs: ["1021"]
//	    drivers: [mlx5_core]
//	  mode: shared            # shared (default) | exclusive | disabled
//	  bandwidth:              # shared mode only; bits per second
//	    default: 10G
//	    minimum: 1G
//	    step: 1G
//	health:
//	  xids:
//	    ignore: [63]          # no device failure here, besides 13 31 43 45 68 109
//	    report: [43]          # a device failure here after all
//	  fatalEffect: NoExecute  # NoSchedule (default) | NoExecute
//	devicePlugin:             # sharing the node with NVIDIA's device plugin
//	  resources: [nvidia.com/gpu, nvidia.com/gpu.shared, "nvidia.com/mig-*"]  # the default
//	  ownedGPUs:              # a split on purpose: these are the agent's, the rest the plugin's
//	    pciAddresses: ["0000:1b:00.0"]
//	    uuids: [GPU-3ae1f2c4-0b6d-4e1a-9c2f-5d7e8f901234]
//	gpus:
//	  migProfiles:            # MIG profiles offered (default: all)
//	    exclude: ["*+me*"]
//	  settings: Leave         # Manage (default) | Leave: MIG mode, compute mode and time slice left as they are
//	vfPolicy:                 # what claims may set on VFs beyond their DeviceClass's VfConfig (default: nothing)
//	  allowedVLANs: [100, "200-299"]  # 0: untagged
//	  allowTrust: false
//	  allowSpoofCheckOff: false
//	  allowMAC: false
//	  allowGUIDs: false
//	  pfs:                    # per PF: the first entry whose select matches decides, wholly
//	  - select: {names: [ens1f0np0]}
//	    allowMAC: true
//	vfio:
//	  allowUnsafeNoIOMMU: false  # hand out /dev/vfio/noiommu-N (DMA into all of the node's memory)
//
// A section left out keeps its defaults: a file with only health offers
// the PFs as no file does. Bandwidth values are quantities, quoted ("10G")
// or bare numbers of bits per second. What the fields mean is on the
// types; package config resolves a validated file against the node's PFs.
//
// +k8s:deepcopy-gen=package
package v1alpha1
