package agent

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/backend"
	"github.com/hwdra/hwdra/hw"
	"github.com/hwdra/hwdra/metadata"
	"github.com/hwdra/hwdra/prepare"
	nicprep "github.com/hwdra/hwdra/prepare/nic"
	hwslices "github.com/hwdra/hwdra/slices"
)

// podNetwork is the NIC driver's NRI side: the plugin that moves VFs into
// pods and the writer of their claims' status.
type podNetwork struct {
	plugin *metadata.Plugin
	status *metadata.StatusWriter
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
	status := metadata.NewStatusWriter(client, hwslices.NICDriver)
	writes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hwdra_claim_status_writes_total",
		Help: "ResourceClaim status.devices applies, by result.",
	}, []string{"result"})
	m.registry.MustRegister(writes)
	status.OnWrite = func(err error) {
		if err != nil {
			writes.WithLabelValues("error").Inc()
		} else {
			writes.WithLabelValues("success").Inc()
		}
	}
	p, err := metadata.New(metadata.Options{
		DriverName: hwslices.NICDriver, Socket: opts.NRISocket, StateDir: opts.StateDir,
		SysfsRoot: node.SysfsRoot, HostNetns: node.HostNetns, RDMA: node.RDMA, Status: status, Settle: node.Settle,
	})
	if err != nil {
		return nil, fmt.Errorf("NRI plugin: %w", err)
	}
	return &podNetwork{plugin: p, status: status}, nil
}

// network is what the NIC driver sees of it (nil without NRI).
func (n *podNetwork) network() nicprep.PodNetwork {
	if n == nil {
		return nil
	}
	return n.plugin
}

// run serves the runtime's hooks and writes claim status until ctx ends.
// drivers and helpers are the agent's, in the same order.
func (n *podNetwork) run(ctx context.Context, drivers []Driver, helpers []*kubeletplugin.Helper) error {
	if n == nil {
		return nil
	}
	for i, d := range drivers {
		if d.Name != hwslices.NICDriver {
			continue
		}
		nic, ok := d.Plugin.(*prepare.Plugin[nicprep.Record])
		if !ok {
			return fmt.Errorf("NRI plugin: %s has no prepared-claims view (%T)", d.Name, d.Plugin)
		}
		go n.status.Run(ctx)
		go func() {
			defer n.plugin.Close()
			_ = n.plugin.Run(ctx, nic.Claims, helpers[i])
		}()
		klog.FromContext(ctx).Info("NRI plugin started", "socket", n.plugin.Socket())
		return nil
	}
	return nil
}
