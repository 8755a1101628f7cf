// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package police holds GPU shares to what the scheduler counted.
//
// A GPU share's limits reach its processes as MPS client environment
// (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE),
// which a process may rewrite; on a real H200 such a process took 48 GiB
// and every SM beside a neighbour's share. So the Watcher looks, on every
// GPU that serves shares, at each process NVML lists there (it sees
// through MPS), confirms it (a pidfd, then NVML's list again: a PID
// reused meanwhile is left alone), maps it through its cgroup to its pod,
// container and claims, reads its environment (a bounded stream, env.go),
// and acts on what it finds (decide.go): a share whose processes
// together hold more GPU memory than the share, a client whose
// environment shows limits above its share (or none), a process of a
// share's container outside MPS, and a pod's process that uses no claim
// of the GPU. gpus.shares.overuse says whether such a process is stopped
// (SIGKILL through the pidfd, as the kernel's OOM killer does) or only
// reported; both post an Event on its pod and count it. A process outside
// Kubernetes is reported, never stopped.
//
// What it cannot see: memory is NVML's figure, caught at the next round;
// compute is not. /proc/<pid>/environ is the process's live memory, not
// what its CUDA read: a process that sets its limits with setenv(3), or
// rewrites them in place before the police first reads them, shows what
// it likes. NVML's per-process utilization is the share of time a
// process had a kernel running, not the share of SMs it ran on, so it
// cannot tell a client at 40% of the SMs from one at 100% either. A
// policed share's compute holds only against processes that keep their
// environment; a dedicated share's daemon, or a MIG partition, holds it
// against one that does not.
package police
