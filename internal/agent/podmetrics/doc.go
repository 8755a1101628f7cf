// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package podmetrics serves the agent's per-pod series: which pod holds
// which prepared device (hwdra_claim_device_info, labelled to join
// dcgm-exporter's series on Hostname, UUID and GPU_I_ID), what each GPU
// share and VF was given, the GPU memory each pod's processes hold on its
// devices (NVML's process listing, mapped to pods through the processes'
// cgroups as the share police maps them), each VF's traffic counters
// where its PF's driver keeps them, and how full each pool is.
//
// Everything is read at scrape time: the drivers' checkpoints (without a
// lock), the pod informer, NVML's process listing of each GPU with
// prepared devices (kept a few seconds, read at most once at a time per
// GPU, never under a lock, and not waited for past a bound: a GPU NVML
// cannot read gives hwdra_gpu_processes_up 0, never an error page). An
// unprepared claim's series are gone at the next scrape; after an agent
// restart they come back from the checkpoint.
package podmetrics
