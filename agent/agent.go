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
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/backend"
	"github.com/hwdra/hwdra/config"
)

// Options are the agent's settings (its command-line flags).
type Options struct {
	NodeName   string
	Hardware   string
	ConfigPath string
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
	node, err := backend.Open(opts.Hardware)
	if err != nil {
		return err
	}
	defer func() {
		if err := node.Close(); err != nil {
			logger.Error(err, "Closing hardware")
		}
	}()

	m := newMetrics()
	if opts.MetricsAddress != "" {
		if err := m.serve(ctx, opts.MetricsAddress); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	pub := newPublisher(opts.NodeName, cfg, node.Inventory)
	pub.metrics = m
	inv, err := node.Inventory(ctx)
	if err != nil {
		logger.Error(err, "Some devices could not be read")
	}
	pub.inv = inv

	drivers, err := buildDrivers(ctx, opts, node, pub, inv)
	if err != nil {
		return err
	}
	if len(drivers) == 0 {
		logger.Info("No GPUs and no SR-IOV NICs on this node: nothing to serve; waiting for termination")
	}
	var helpers []*kubeletplugin.Helper
	defer func() {
		for _, h := range helpers {
			h.Stop()
		}
	}()
	for _, d := range drivers {
		// The kubelet owns the plugins directory; each driver its own
		// subdirectory (socket, metadata files).
		dataDir := filepath.Join(opts.PluginsDir, d.Name)
		if err := os.MkdirAll(dataDir, 0o750); err != nil {
			return err
		}
		helper, err := kubeletplugin.Start(ctx, observed(d, m, pub.Poke),
			kubeletplugin.DriverName(d.Name),
			kubeletplugin.NodeName(opts.NodeName),
			kubeletplugin.KubeClient(opts.KubeClient),
			kubeletplugin.RegistrarDirectoryPath(opts.RegistrarDir),
			kubeletplugin.PluginDataDirectoryPath(dataDir),
			kubeletplugin.CDIDirectory(opts.CDIDir),
			kubeletplugin.EnableDeviceMetadata(true, metadataVersions),
			// Claims of different pods prepare concurrently; the drivers
			// lock per device.
			kubeletplugin.Serialize(false),
			// No health reports yet: tell the kubelet so rather than
			// failing its health stream on every connection.
			kubeletplugin.HealthService(false),
		)
		if err != nil {
			return fmt.Errorf("start kubelet plugin %s: %w", d.Name, err)
		}
		helpers = append(helpers, helper)
		pub.publish[d.Name] = helper.PublishResources
		logger.Info("Kubelet plugin started", "driver", d.Name)
	}
	if err := pub.sync(ctx); err != nil {
		logger.Error(err, "Publishing devices")
	}
	pub.run(ctx, opts.Rescan, node.Changes(ctx))
	logger.Info("Shutting down")
	return nil
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
