// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podmetrics

import "github.com/prometheus/client_golang/prometheus"

// The series' labels. Hostname, UUID, GPU_I_ID and GPU_I_PROFILE are
// named and valued as dcgm-exporter names and values its own (its
// rendermetrics template: UUID the physical GPU's, also on a MIG
// instance's series; GPU_I_ID NVML's GPU instance ID; Hostname its
// NODE_NAME), so that one `* on(Hostname, UUID, GPU_I_ID) group_left`
// gives its series a pod. Label values come from the checkpoint and the
// pod informer and reach the exposition through the client library,
// which escapes them.
var (
	infoDesc = prometheus.NewDesc("hwdra_claim_device_info",
		"1 for each device of a claim prepared on the node and each pod of the node that uses the claim: which pod holds which GPU, MIG partition, share or VF. "+
			"Its Hostname, UUID and GPU_I_ID labels are dcgm-exporter's, to join its series on.",
		[]string{"namespace", "pod", "claim", "request", "driver", "pool", "device", "type",
			"Hostname", "UUID", "GPU_I_ID", "GPU_I_PROFILE", "mig_uuid", "compute_instance", "sharing", "pci_address"}, nil)

	shareMemoryDesc = prometheus.NewDesc("hwdra_claim_gpu_share_memory_bytes",
		"The GPU memory a prepared GPU share was counted for: its processes' limit.",
		[]string{"namespace", "claim", "request", "pool", "device", "Hostname", "UUID"}, nil)
	shareComputeDesc = prometheus.NewDesc("hwdra_claim_gpu_share_compute_percent",
		"The part of its GPU's multiprocessors a prepared GPU share was counted for, in percent.",
		[]string{"namespace", "claim", "request", "pool", "device", "Hostname", "UUID"}, nil)
	vfRateDesc = prometheus.NewDesc("hwdra_claim_vf_tx_rate_bits_per_second",
		"A prepared VF's transmit rate limit as set on it: bound max (max_tx_rate, a share's bandwidth) or min (min_tx_rate, where the PF's driver takes one).",
		[]string{"namespace", "claim", "request", "pool", "device", "vf", "bound"}, nil)

	memoryDesc = prometheus.NewDesc("hwdra_pod_gpu_memory_used_bytes",
		"GPU memory a pod's processes hold on a prepared device (NVML's process listing; MPS clients included), by the claim device its container uses.",
		[]string{"namespace", "pod", "claim", "device", "Hostname", "UUID", "GPU_I_ID"}, nil)
	unclaimedDesc = prometheus.NewDesc("hwdra_gpu_unclaimed_memory_used_bytes",
		"GPU memory on a GPU with prepared claims held by processes no prepared claim of their pod covers: MPS servers, processes outside Kubernetes or in pods the agent does not know, pods without a claim of the GPU.",
		[]string{"Hostname", "UUID", "GPU_I_ID"}, nil)
	processesUpDesc = prometheus.NewDesc("hwdra_gpu_processes_up",
		"1 when NVML listed the processes of a GPU with prepared claims at the last read, 0 when it could not (an error, or no answer within 2 s): its pods' memory series are then missing.",
		[]string{"Hostname", "UUID", "pci_address"}, nil)

	poolSizeDesc = prometheus.NewDesc("hwdra_pool_units",
		"GPUs and VFs in the node's published pools, by driver, pool and unit (gpu, vf).",
		[]string{"driver", "pool", "unit"}, nil)
	poolUsedDesc = prometheus.NewDesc("hwdra_pool_units_in_use",
		"GPUs and VFs of the node's published pools that a prepared claim holds (a GPU with any device of it prepared), by driver, pool and unit.",
		[]string{"driver", "pool", "unit"}, nil)

	vfBytesDesc = prometheus.NewDesc("hwdra_claim_vf_bytes_total",
		"Bytes a prepared VF received or transmitted, as its PF's driver counts them (IFLA_VF_STATS; absent where the driver keeps none).",
		[]string{"namespace", "claim", "request", "pool", "device", "vf", "direction"}, nil)
	vfPacketsDesc = prometheus.NewDesc("hwdra_claim_vf_packets_total",
		"Packets a prepared VF received or transmitted, as its PF's driver counts them.",
		[]string{"namespace", "claim", "request", "pool", "device", "vf", "direction"}, nil)
	vfDroppedDesc = prometheus.NewDesc("hwdra_claim_vf_dropped_packets_total",
		"Packets of a prepared VF its PF's driver dropped, by direction.",
		[]string{"namespace", "claim", "request", "pool", "device", "vf", "direction"}, nil)
	vfStatsUpDesc = prometheus.NewDesc("hwdra_pf_vf_stats_up",
		"1 when the PF of prepared VFs answered for its VFs' counters at the last scrape, 0 when netlink failed.",
		[]string{"pf"}, nil)
)

var descs = []*prometheus.Desc{infoDesc, shareMemoryDesc, shareComputeDesc, vfRateDesc,
	memoryDesc, unclaimedDesc, processesUpDesc, poolSizeDesc, poolUsedDesc,
	vfBytesDesc, vfPacketsDesc, vfDroppedDesc, vfStatsUpDesc}
