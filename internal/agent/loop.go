// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/deviceplugin"
	"github.com/hwdra/hwdra/internal/agent/health"
	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/podmetrics"
	"github.com/hwdra/hwdra/internal/agent/podnet"
	"github.com/hwdra/hwdra/internal/agent/police"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	gpuprep "github.com/hwdra/hwdra/internal/agent/prepare/gpu"
	nicprep "github.com/hwdra/hwdra/internal/agent/prepare/nic"
	"github.com/hwdra/hwdra/internal/agent/publish"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/hw"
)

// The runtime loop: publish reads the hardware and what prepare made,
// prepare reads what was published, health feeds both, and pod networking
// reads what prepare holds. Each arrow is a small interface, declared by
// the package that calls it; serve.go wires them, and this file says who
// implements which (the compiler checks it):
//
//	caller                     interface                 implemented by
//	publish.Publisher      --> publish.Hardware          backend.Node: probes the node
//	publish.Publisher      --> publish.Unclaimed         gpuprep.Driver: leaves the claims' partitions out of a probe
//	publish.Publisher      --> publish.Health            nodeHealth: holds what a probe cannot tell, faults to taint, learns each publication
//	publish.Publisher      --> publish.DevicePlugin      deviceplugin.Watcher: GPUs NVIDIA's device plugin serves are withheld
//	prepare/gpu, /nic      --> prepare.Published         publish.Publisher: an allocated device is looked up in what was published
//	prepare.Plugin         --> prepare.ErrorHandler      publish.Publisher: a field the API server dropped makes it fall back
//	prepare.Plugin         --> prepare.Cluster           nodeClaims: reclaim keeps what an allocated claim may use
//	prepare.Plugin (GPU)   --> prepare.Reporter          gpuStatusReporter: a claim prepared gets its status.devices entries, written in the background
//	health.Stream          --> health.Source             driverHealth: a driver's published devices and their faults, for the kubelet
//	podnet.Plugin          --> podnet.Prepared           prepare.Plugin (NIC): the prepared claims whose VFs go into pods
//	podnet.Plugin          --> podnet.MetadataWriter     kubeletplugin.Helper (NIC): the deferred network metadata
//	podnet.Plugin          --> podnet.Pods               podClaims: the claims a pod names
//	podnet.Plugin          --> podnet.Settler            backend.Node: sysfs current after a netdev moved
//	podnet.Plugin          --> podnet.HookObserver       metrics: each runtime hook's duration
//	podnet.Plugin          --> podnet.Links              backend.Node.VFLinks: the mock's veth stand-ins by identity (nil on a host: the kernel's parent device)
//	podnet.Plugin          --> podnet.Events             lazyEvents: a pod's VF that cannot be found to return it
//	metadata.StatusWriter  --> metadata.WriteObserver    metrics: each claim status write
//	deviceplugin.Watcher   --> deviceplugin.Resources    config.AgentConfig: the device plugin's resource names
//	police.Watcher         --> police.Claims             gpuClaims: the GPU driver's prepared claims and the shares they were counted for
//	police.Watcher         --> police.Processes          nvml.Backend: the processes on a GPU, MPS clients included
//	police.Watcher         --> police.Pods               nodePods: a process's pod (by the UID its cgroup names), containers and claims
//	police.Watcher         --> police.Observer           metrics: what it found and did, what a round costs
//	podmetrics.Collector   --> podmetrics.Claims         gpuClaimDevices, nicClaims: the drivers' checkpoints, read without a lock
//	podmetrics.Collector   --> podmetrics.Pods           nodePods: the pods that use a claim, a process's pod
//	podmetrics.Collector   --> podmetrics.Processes      nvml.Backend: the processes on a GPU with prepared devices
//	podmetrics.Collector   --> podmetrics.Published      publishedUnits: the GPUs and VFs of what was last published
//	podmetrics.Collector   --> podmetrics.VFStats        vfStats: VF counters through the PF's netdev
//
// The health monitors close the loop from the other side: a change of
// faults notifies the streams and wakes the publisher (nodeHealth.onChange),
// which republishes with taints.
var (
	_ publish.Hardware                 = (*backend.Node)(nil)
	_ publish.Unclaimed                = (*gpuprep.Driver)(nil)
	_ publish.Health                   = (*nodeHealth)(nil)
	_ publish.DevicePlugin             = (*deviceplugin.Watcher)(nil)
	_ prepare.Published                = (*publish.Publisher)(nil)
	_ prepare.ErrorHandler             = (*publish.Publisher)(nil)
	_ prepare.Cluster                  = nodeClaims{}
	_ prepare.Reporter[gpuprep.Record] = gpuStatusReporter{}
	_ health.Source                    = driverHealth{}
	_ podnet.Prepared                  = (*prepare.Plugin[nicprep.Record])(nil)
	_ podnet.MetadataWriter            = (*kubeletplugin.Helper)(nil)
	_ podnet.Pods                      = podClaims{}
	_ podnet.Settler                   = (*backend.Node)(nil)
	_ podnet.HookObserver              = (*metrics)(nil)
	_ podnet.Links                     = hw.VFLinks(nil)
	_ podnet.Events                    = lazyEvents{}
	_ metadata.WriteObserver           = (*metrics)(nil)
	_ deviceplugin.Resources           = (*config.AgentConfig)(nil)
	_ police.Claims                    = gpuClaims{}
	_ police.Processes                 = (*nvml.Backend)(nil)
	_ police.Pods                      = (*nodePods)(nil)
	_ police.Observer                  = (*metrics)(nil)
	_ podmetrics.Claims                = gpuClaimDevices{}
	_ podmetrics.Claims                = nicClaims{}
	_ podmetrics.Pods                  = (*nodePods)(nil)
	_ podmetrics.Processes             = (*nvml.Backend)(nil)
	_ podmetrics.Published             = publishedUnits{}
	_ podmetrics.VFStats               = vfStats{}
)
