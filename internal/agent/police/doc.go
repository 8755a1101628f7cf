// Package police holds GPU shares to what the scheduler counted.
//
// A GPU share's limits reach its processes as MPS client environment
// (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE),
// which a process may rewrite; on a real H200 such a process took 48 GiB
// and every SM beside a neighbour's share. So the Watcher looks, on every
// GPU that serves shares, at each process NVML lists there (it sees
// through MPS), maps it through its cgroup to its pod, container and
// claims, reads the environment it started with, and acts on what it
// finds (decide.go): a share whose processes together hold more GPU
// memory than the share, a client that started with limits above its
// share, a process of a share's container outside MPS, and a pod's
// process that uses no claim of the GPU. gpus.shares.overuse says whether
// such a process is stopped (SIGKILL through a pidfd, as the kernel's
// OOM killer does) or only reported; both post an Event on its pod and
// count it. A process outside Kubernetes is reported, never stopped.
//
// Compute is not sampled: NVML's per-process utilization is the share of
// time a process had a kernel running, not the share of SMs it ran on, so
// it cannot tell a client at 40% of the SMs from one at 100%. A client's
// thread percentage is checked in its start environment only; a process
// that raises it from inside is held only by a dedicated share's daemon.
package police
