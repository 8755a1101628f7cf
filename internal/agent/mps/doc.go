// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package mps runs the CUDA Multi-Process Service control daemons of the
// GPU driver: one per set of GPUs (or MIG partitions) whose processes
// share through MPS, the claim's GPUs for a claim with the MPS sharing
// strategy, a GPU for the policed GPU shares of independent claims, a GPU
// for one dedicated share (its defaults the share's limits).
//
// What a daemon is and what its clients get is computed first, without
// side effects (Spec, its Commands, ClientEdits); Manager then makes it
// so: it records each daemon in its state file before it starts it,
// starts nvidia-cuda-mps-control -f from the driver root with its pipe
// and log directories under the agent's state directory, sets the
// clients' defaults through the daemon's control interface, and stops it
// ("quit") when the driver no longer needs it.
//
// Every client mounts the daemon's pipe directory read-write and its
// shared memory as /dev/shm: tenants reach both, so nothing there is
// trusted. The daemon is the process the agent launched (the PID its
// fork returned, with the start time, program and cgroup recorded), and
// it is signalled through a pidfd after those are checked; its PID file
// is never read. Its shared memory is a size-limited tmpfs of its own.
// The daemon runs with a minimal environment, without the agent's
// service account token, with the capabilities a control daemon needs
// and no_new_privs, in a memory-limited cgroup of its own.
//
// A daemon outlives the agent: running pods keep their MPS server across
// an agent restart and a rolling update. The new agent finds it in the
// state file and checks it; Supervise starts a daemon that died (or that
// no longer answers on its own control pipe) again. To outlive the
// agent's container a daemon runs in a session and mount namespace of
// its own and, where the agent runs in a pod, in a cgroup beside the
// pod's (the runtime and the kubelet kill whatever is left in a
// container's and a pod's cgroups).
package mps
