// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package podnet is pod networking: the NIC driver's NRI plugin, which
// finishes a VF's way into its pod, after prepare. It sits above prepare
// and metadata (it reads the prepared claims and writes metadata); nothing
// below prepare imports it. Inside the agent, it moves each prepared VF's
// netdev into the pod's network namespace when the sandbox starts, writes
// the deferred KEP-5304 network metadata (metadata.Network), and reports
// the interface in the claim's status.devices (metadata.StatusWriter);
// when the sandbox stops it brings the netdev back.
//
// # Hooks
//
// RunPodSandbox finds the pod's VFs in the NIC driver's prepared claims
// (the pods each claim was reserved for at prepare, and the claims the pod
// names, from the node's pods: a second pod sharing a claim is in no
// prepare record), in a stable order. A VF another running pod has
// refuses the sandbox: a claim with a VF serves one pod at a time. For
// each VF: records a placement (the netdev's host name, MTU, MAC,
// addresses and state, and the pod's namespace path) in
// <state dir>/sriov.hwdra.io.netns.json, moves the netdev into the pod's
// namespace with its new name, MTU and MAC in one netlink request, adds
// the configured addresses and routes and brings it up; where the
// kernel's RDMA subsystem is in exclusive mode, the VF's RDMA device
// moves too. Then it rewrites each request's metadata file (generation 2,
// with networkData: interface name, addresses in CIDR form, MAC) before
// any container of the pod exists, and queues the claims' status. A
// failure anywhere undoes everything done for the pod, fails the hook
// with an error naming the claim and device (the kubelet retries the
// sandbox), and the claims' status says why.
//
// CreateContainer checks that the pod has all of its VFs before any of
// its containers is created, attaching those it lacks (a sandbox that
// started while the plugin was away) or refusing the container. With
// containerd's default validator requiring this plugin for the pod (the
// pod's NRI required-plugins annotation), no container of it is created
// while the plugin is away.
//
// StopPodSandbox and RemovePodSandbox bring the pod's netdevs back under
// their host names with their MTU, MAC, addresses and state, using the
// namespace path recorded at RunPodSandbox (containerd may leave it out).
// A VF is found in the pod's namespace (and the host's) by what the
// kernel says of the link, never by its name, which a pod with
// CAP_NET_ADMIN chooses (it can rename its VF and make a veth under the
// VF's name): its parent device, the VF's PCI function, or on a kernel
// that reports none the ifindex and permanent MAC recorded after the move
// (sriov.Netns.VFLink; Options.Links for the mock's stand-ins, by their
// peers), and it is moved and configured by ifindex. A VF in neither the
// pod's namespace nor the host (the pod moved it on) is reported, in the
// log and a Warning Event on the pod, nothing is moved or configured, and
// its placement is kept: the return is retried, and the kernel returns
// the VF to the host when the namespace that holds it is destroyed.
// Where the namespace is gone, a physical VF comes back by itself (the
// kernel returns devices of a destroyed namespace to the host, named
// dev<n> if its name is taken) and is found by its PCI address in sysfs;
// a VF not back yet is returned by unprepare, which waits for it
// (nic.PodNetwork.Release) and also returns VFs whose stop hook never
// came.
//
// Synchronize, on every (re)connect, returns the VFs of pods that no
// longer run, keeps and records those of running pods, moves VFs into
// running pods that lack them, and queues their status again (a write
// lost with a crash is written then).
//
// Every hook is idempotent and bounded well inside containerd's 2 s NRI
// timeout: netlink requests time out after 500 ms, no hook waits on the
// API server or for a VF to come back.
//
// # Connection
//
// Run connects to the runtime's NRI socket and reconnects with backoff
// when the runtime restarts; meanwhile Ready fails, and so does prepare
// of a NIC claim (a pod must not start without its network).
//
// Claim status goes through metadata.StatusWriter, in the background: no
// hook waits on the API server.
package podnet
