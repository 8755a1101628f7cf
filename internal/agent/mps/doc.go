// Package mps runs the CUDA Multi-Process Service control daemons of the
// GPU driver: one per set of GPUs (or MIG partitions) whose processes
// share through MPS, the claim's GPUs for a claim with the MPS sharing
// strategy, a GPU for the policed GPU shares of independent claims, a GPU
// for one dedicated share (its defaults the share's limits).
//
// What a daemon is and what its clients get is computed first, without
// side effects (Spec, its Commands, ClientEdits); Manager then makes it
// so: it records each daemon in its state file before it starts it,
// starts nvidia-cuda-mps-control -d from the driver root with its pipe
// and log directories under the agent's state directory, sets the
// clients' defaults through the daemon's control interface, and stops it
// ("quit") when the driver no longer needs it.
//
// A daemon outlives the agent: running pods keep their MPS server across
// an agent restart and a rolling update. The new agent finds it in the
// state file (its PID and start time) and checks it through its control
// pipe; Supervise starts a daemon that died again. To outlive the agent's
// container a daemon runs in a session and mount namespace of its own,
// whose /dev/shm is the daemon's shared-memory directory (MPS servers and
// clients meet in /dev/shm, so the clients get the same directory there),
// and, where the agent runs in a pod, in a cgroup beside the pod's (the
// runtime and the kubelet kill whatever is left in a container's and a
// pod's cgroups).
package mps
