// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/podnet"
	nicprep "github.com/hwdra/hwdra/internal/agent/prepare/nic"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/hw"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// podNetwork is the NIC driver's NRI side: the plugin that moves VFs into
// pods and the writer of their claims' status.
type podNetwork struct {
	plugin *podnet.Plugin
	status *metadata.StatusWriter
	pods   *nodePods
	done   chan struct{} // closed when the plugin has stopped
	// started: run started the plugin.
	started bool
}

// newPodNetwork opens the NRI plugin for a node with NICs; nil when
// --nri-socket is empty (runtimes without NRI) or the node has none.
func newPodNetwork(ctx context.Context, opts Options, client kubernetes.Interface, pods *nodePods, node *backend.Node, inv hw.Inventory, m *metrics, events podnet.Events) (*podNetwork, error) {
	logger := klog.FromContext(ctx)
	if len(inv.PFs) == 0 {
		return nil, nil
	}
	if opts.NRISocket == "" {
		logger.Info("NRI is off (--nri-socket is empty): VF netdevs stay in the host network namespace and pods get no interface, no network metadata and no claim network status")
		return nil, nil
	}
	status := metadata.NewStatusWriter(client, device.NICDriver, m)
	p, err := podnet.New(podnet.Options{
		DriverName: device.NICDriver, Socket: opts.NRISocket, StateDir: opts.StateDir,
		SysfsRoot: node.SysfsRoot, HostNetns: node.HostNetns, RDMA: node.RDMA, Status: status, Sysfs: node,
		Pods: podClaims{pods.inf.Lister()}, Observer: m, Links: node.VFLinks, Events: events,
	})
	if err != nil {
		return nil, fmt.Errorf("NRI plugin: %w", err)
	}
	return &podNetwork{plugin: p, status: status, pods: pods, done: make(chan struct{})}, nil
}

// lazyEvents records through the agent's recorder, which starts at the
// first Event (podnet.Events).
type lazyEvents struct {
	s   *server
	ctx context.Context
}

func (e lazyEvents) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...interface{}) {
	e.s.events(e.ctx).Eventf(regarding, related, eventtype, reason, action, note, args...)
}

// podClaims are the node's pods as the NRI plugin asks about them
// (podnet.Pods).
type podClaims struct{ lister corelisters.PodLister }

// ClaimsOf names the ResourceClaims of a pod the lister has (nil for one
// it does not know, or one of the same name with another UID).
func (p podClaims) ClaimsOf(namespace, name string, uid types.UID) []string {
	pod, err := p.lister.Pods(namespace).Get(name)
	if err != nil || pod.UID != uid {
		return nil
	}
	var out []string
	for i := range pod.Spec.ResourceClaims {
		if n, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i]); err == nil && n != nil {
			out = append(out, *n)
		}
	}
	return out
}

// network is what the NIC driver sees of it (nil without NRI).
func (n *podNetwork) network() nicprep.PodNetwork {
	if n == nil {
		return nil
	}
	return n.plugin
}

// run serves the runtime's hooks for the NIC driver's prepared claims,
// and writes their status, until ctx ends.
func (n *podNetwork) run(ctx context.Context, nic *NIC) {
	if n == nil || nic == nil {
		return
	}
	go n.status.Run(ctx)
	// Hooks never wait for it: a pod it does not know yet is found
	// through the prepare records only.
	n.pods.start(ctx)
	n.started = true
	go func() {
		defer close(n.done)
		defer n.plugin.Close()
		_ = n.plugin.Run(ctx, nic.Plugin, nic.helper)
	}()
	klog.FromContext(ctx).Info("NRI plugin started", "socket", n.plugin.Socket())
}

// wait waits until the NRI plugin has stopped (its context ended), so that
// a newer agent never meets it still connected.
func (n *podNetwork) wait() {
	if n == nil || !n.started {
		return
	}
	<-n.done
}

// ready is the readiness check of the NRI plugin, nil without one.
func (n *podNetwork) ready() func() error {
	if n == nil {
		return nil
	}
	return n.plugin.Ready
}
