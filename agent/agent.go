// Package agent is the node agent: it opens the hardware, runs one kubelet
// plugin per driver that has hardware on the node, and keeps the node's
// ResourceSlices equal to what the hardware offers.
package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/backend"
	"github.com/hwdra/hwdra/config"
	"github.com/hwdra/hwdra/hw"
)

// Options are the agent's settings (its command-line flags).
type Options struct {
	NodeName   string
	Hardware   string
	ConfigPath string
	// KubeConfig reaches the API server; each of the agent's two clients
	// (claims, slices) may send KubeAPIQPS requests a second, in bursts of
	// KubeAPIBurst.
	KubeConfig   *rest.Config
	KubeAPIQPS   float32
	KubeAPIBurst int
	// KubeClient, when set, serves as both clients instead (tests).
	KubeClient kubernetes.Interface
	// RegistrarDir is the kubelet's plugin registration directory;
	// PluginsDir holds one directory per driver with its socket.
	RegistrarDir, PluginsDir string
	// CDIDir is where CDI specs go (the container runtime's spec dir).
	CDIDir string
	// StateDir keeps checkpoints.
	StateDir string
	// Rescan is how often hardware is probed again.
	Rescan time.Duration
	// MetricsAddress serves /metrics and /healthz; empty: off.
	MetricsAddress string
	// NRISocket is the container runtime's NRI socket, where the NRI
	// plugin that moves VFs into pods connects; empty: no NRI.
	NRISocket string

	// node is hardware a test opened (Hardware is then ignored); the
	// test closes it.
	node *backend.Node
	// featureRecheck, in tests, replaces how often a fallback model checks
	// for the full one (10 minutes).
	featureRecheck time.Duration
}

// metadataVersions: the newest first, so containers that read the older
// one still find it.
var metadataVersions = []schema.GroupVersion{
	{Group: "metadata.resource.k8s.io", Version: "v1beta1"},
	{Group: "metadata.resource.k8s.io", Version: "v1alpha1"},
}

// Run runs the agent until ctx is cancelled.
func Run(ctx context.Context, opts Options) error {
	logger := klog.FromContext(ctx)
	cfg, err := config.Load(opts.ConfigPath)
	if err != nil {
		return err
	}
	node := opts.node
	if node == nil {
		if node, err = backend.Open(opts.Hardware); err != nil {
			return err
		}
		defer func() {
			if err := node.Close(); err != nil {
				logger.Error(err, "Closing hardware")
			}
		}()
	}

	m := newMetrics()
	claimClient, sliceClient := opts.KubeClient, opts.KubeClient
	if claimClient == nil {
		if claimClient, sliceClient, err = newClients(opts.KubeConfig, opts.KubeAPIQPS, opts.KubeAPIBurst, m); err != nil {
			return err
		}
	}
	if opts.MetricsAddress != "" {
		if err := m.serve(ctx, opts.MetricsAddress); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	pub := newPublisher(opts.NodeName, sliceClient, cfg, m)
	if opts.featureRecheck > 0 {
		pub.recheckEvery = opts.featureRecheck
	}
	defer pub.stop()
	hs := newNodeHealth(pub, cfg)
	inv, err := node.Inventory(ctx)
	if err != nil {
		logger.Error(err, "Some devices could not be read")
	}
	pub.inv = inv

	// Claim status goes through the claims' client, which the kubelet
	// plugin library's claim reads share.
	pods, err := newPodNetwork(ctx, opts, claimClient, node, inv, m)
	if err != nil {
		return err
	}
	drivers, err := buildDrivers(ctx, opts, node, pub, inv, claimClient, pods.network())
	if err != nil {
		return err
	}
	if len(drivers) == 0 && !node.NVMLPending() {
		logger.Info("No GPUs and no SR-IOV NICs on this node: nothing to serve; waiting for termination")
	}
	hs.addDrivers(drivers)
	pub.probe = hs.probing(func(ctx context.Context) (hw.Inventory, error) {
		return unclaimedProbe(node, hs.drivers())(ctx)
	})
	// Before the plugins serve, so that the first prepare finds its device
	// in the catalog of what the hardware can deliver.
	pub.refresh(ctx)

	var (
		helpersMu sync.Mutex
		helpers   []*kubeletplugin.Helper
	)
	defer func() {
		helpersMu.Lock()
		defer helpersMu.Unlock()
		for _, h := range helpers {
			h.Stop()
		}
	}()
	// serve starts a driver's kubelet plugin, then publishes its pool.
	serve := func(ctx context.Context, d Driver) error {
		helper, err := startPlugin(ctx, opts, claimClient, d, m, hs)
		if err != nil {
			return err
		}
		helpersMu.Lock()
		helpers = append(helpers, helper)
		helpersMu.Unlock()
		pub.addDriver(d.Name)
		return nil
	}
	for _, d := range drivers {
		if err := serve(ctx, d); err != nil {
			return err
		}
	}
	if len(inv.PFs) > 0 {
		hs.startNIC(ctx, node)
	}
	if gpu := node.GPU(); gpu != nil && len(inv.GPUs) > 0 {
		hs.startGPU(ctx, gpu)
	}
	if node.NVMLPending() {
		go waitNVML(ctx, node, func(ctx context.Context) error {
			if !pub.refresh(ctx) {
				return ctx.Err()
			}
			inv, _ := pub.current()
			if len(inv.GPUs) == 0 {
				return fmt.Errorf("NVML is up but shows no GPU")
			}
			gpuDrivers, err := buildDrivers(ctx, opts, node, pub, hw.Inventory{GPUs: inv.GPUs}, claimClient, nil)
			if err != nil {
				return err
			}
			hs.addDrivers(gpuDrivers)
			for _, d := range gpuDrivers {
				if err := serve(ctx, d); err != nil {
					return err
				}
			}
			hs.startGPU(ctx, node.GPU())
			pub.Poke()
			return nil
		})
	}
	// The NRI plugin connects first: until it has, NIC claims are refused.
	helpersMu.Lock()
	started := slices.Clone(helpers[:len(drivers)])
	helpersMu.Unlock()
	if err := pods.run(ctx, drivers, started); err != nil {
		return err
	}
	// Published once the plugins serve: a pod the scheduler places here
	// right away finds its driver.
	if err := pub.publishCurrent(ctx); err != nil {
		logger.Error(err, "Publishing devices")
	}
	pub.run(ctx, opts.Rescan, nil)
	logger.Info("Shutting down")
	return nil
}

// startPlugin starts a driver's kubelet plugin, with its health stream.
func startPlugin(ctx context.Context, opts Options, client kubernetes.Interface, d Driver, m *metrics, hs *nodeHealth) (*kubeletplugin.Helper, error) {
	// The kubelet owns the plugins directory; each driver its own
	// subdirectory (socket, metadata files).
	dataDir := filepath.Join(opts.PluginsDir, d.Name)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return nil, err
	}
	helper, err := kubeletplugin.Start(ctx, withHealth(observed(d, m), hs.stream(d.Name)),
		kubeletplugin.DriverName(d.Name),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(opts.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.CDIDirectory(opts.CDIDir),
		kubeletplugin.EnableDeviceMetadata(true, metadataVersions),
		// Claims of different pods prepare concurrently; the drivers
		// lock per device.
		kubeletplugin.Serialize(false),
		// The kubelet watches our health stream (WatchHealthStatus).
		kubeletplugin.HealthService(true),
	)
	if err != nil {
		return nil, fmt.Errorf("start kubelet plugin %s: %w", d.Name, err)
	}
	klog.FromContext(ctx).Info("Kubelet plugin started", "driver", d.Name)
	return helper, nil
}

// unclaimedProbe probes the node as its drivers say it would be without
// what they made for claims: the publisher's view.
func unclaimedProbe(node *backend.Node, drivers []Driver) func(context.Context) (hw.Inventory, error) {
	return func(ctx context.Context) (hw.Inventory, error) {
		probe := func() (hw.Inventory, error) { return node.Inventory(ctx) }
		for _, d := range drivers {
			if d.Unclaimed != nil {
				inner := probe
				probe = func() (hw.Inventory, error) { return d.Unclaimed(inner) }
			}
		}
		return probe()
	}
}

// onError is the drivers' background error handler: dropped fields make the
// publisher fall back; everything else is logged (and retried by the
// slice controller).
func (p *publisher) onError(ctx context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) {
		p.dropFeatures(ctx, dropped.DisabledFeatures())
		return
	}
	klog.FromContext(ctx).Error(err, msg)
}
