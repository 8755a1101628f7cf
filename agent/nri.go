package agent

import (
	"context"
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/backend"
	"github.com/hwdra/hwdra/hw"
	"github.com/hwdra/hwdra/metadata"
	"github.com/hwdra/hwdra/metadata/nri"
	nicprep "github.com/hwdra/hwdra/prepare/nic"

	"github.com/hwdra/hwdra/slices/device"
)

// podNetwork is the NIC driver's NRI side: the plugin that moves VFs into
// pods and the writer of their claims' status.
type podNetwork struct {
	plugin *nri.Plugin
	status *metadata.StatusWriter
	done   chan struct{} // closed when the plugin has stopped
	// started: run started the plugin.
	started bool
}

// newPodNetwork opens the NRI plugin for a node with NICs; nil when
// --nri-socket is empty (runtimes without NRI) or the node has none.
func newPodNetwork(ctx context.Context, opts Options, client kubernetes.Interface, node *backend.Node, inv hw.Inventory, m *metrics) (*podNetwork, error) {
	logger := klog.FromContext(ctx)
	if len(inv.PFs) == 0 {
		return nil, nil
	}
	if opts.NRISocket == "" {
		logger.Info("NRI is off (--nri-socket is empty): VF netdevs stay in the host network namespace and pods get no interface, no network metadata and no claim network status")
		return nil, nil
	}
	status := metadata.NewStatusWriter(client, device.NICDriver)
	status.OnWrite = func(err error) { m.statusWrites.WithLabelValues(result(err)).Inc() }
	p, err := nri.New(nri.Options{
		DriverName: device.NICDriver, Socket: opts.NRISocket, StateDir: opts.StateDir,
		SysfsRoot: node.SysfsRoot, HostNetns: node.HostNetns, RDMA: node.RDMA, Status: status, Settle: node.Settle,
		ObserveHook: m.observeHook,
	})
	if err != nil {
		return nil, fmt.Errorf("NRI plugin: %w", err)
	}
	return &podNetwork{plugin: p, status: status, done: make(chan struct{})}, nil
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
	n.started = true
	go func() {
		defer close(n.done)
		defer n.plugin.Close()
		_ = n.plugin.Run(ctx, nic.Plugin.Claims, nic.helper)
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
