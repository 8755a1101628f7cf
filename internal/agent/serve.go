// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"errors"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/deviceplugin"
	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/podmetrics"
	nicprep "github.com/hwdra/hwdra/internal/agent/prepare/nic"
	"github.com/hwdra/hwdra/internal/agent/publish"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/backend/driverlibs"
	"github.com/hwdra/hwdra/internal/hw"
)

// server is the agent serving the node. serve builds it a step at a time;
// what a step starts is stopped, in reverse order, when serve returns.
type server struct {
	opts Options
	cfg  *config.AgentConfig
	m    *metrics
	pr   *probes

	node *backend.Node
	inv  hw.Inventory // the node as first read
	// claims serves the kubelet plugins (a claim GET per prepare), slices
	// the publisher, status the claim status writes (clients.go).
	claims, slices, status kubernetes.Interface
	// gpuStatus writes GPU claims' status.devices; nil with
	// gpus.claimStatus Off.
	gpuStatus    *metadata.StatusWriter
	health       *nodeHealth
	devicePlugin *deviceplugin.Watcher
	pub          *publish.Publisher
	pods         *podNetwork // nil without NRI
	nodePods     *nodePods   // the node's pods, for the NRI plugin and the share police
	drivers      Drivers     // those of the start (not a late GPU driver)
	cdiHook      string      // nvidia-cdi-hook on the node; "" for none
	podMetrics   *podmetrics.Collector

	mu      sync.Mutex
	stops   []func()
	stopped bool

	recorderOnce   sync.Once
	recorder       events.EventRecorder // events()
	claimLimitOnce sync.Once            // claimLimit told
	statusAuth     statusAuth           // checkStatusAuth's finding
}

// serve serves the node until ctx ends.
func serve(ctx context.Context, opts Options, cfg *config.AgentConfig, m *metrics, pr *probes) error {
	s := &server{opts: opts, cfg: cfg, m: m, pr: pr}
	defer s.stop()
	if err := s.openHardware(ctx); err != nil {
		return err
	}
	if err := s.connect(ctx); err != nil {
		return err
	}
	if err := s.startPublisher(ctx); err != nil {
		return err
	}
	if err := s.buildDrivers(ctx); err != nil {
		return err
	}
	if err := s.startPlugins(ctx); err != nil {
		return err
	}
	s.startNRI(ctx)
	s.startHealth(ctx)
	s.startPodMetrics(ctx)
	s.awaitNVML(ctx)
	s.publish(ctx)
	return nil
}

// openHardware opens the node's hardware (unless a test did) and reads
// what it has.
func (s *server) openHardware(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if s.node = s.opts.node; s.node == nil {
		node, err := backend.OpenWith(s.opts.Hardware, backend.Options{DriverRoot: s.opts.DriverRoot, Logger: logger})
		if err != nil {
			return err
		}
		s.node = node
		s.onStop(func() {
			if err := node.Close(); err != nil {
				logger.Error(err, "Closing hardware")
			}
		})
	}
	inv, err := s.node.Inventory(ctx)
	if err != nil {
		logger.Error(err, "Some devices could not be read")
	}
	s.inv = inv
	node := s.node
	s.pr.setDriver(func() string {
		if node.GPU() == nil && !node.NVMLPending() {
			return "" // no NVIDIA GPU for the driver: nothing to say
		}
		return node.Driver().String()
	})
	return nil
}

// connect makes the agent's API clients, and watches through them
// whether the API server answers: the log and /readyz say so when not.
func (s *server) connect(ctx context.Context) error {
	if s.opts.KubeClient != nil {
		s.claims, s.slices, s.status = s.opts.KubeClient, s.opts.KubeClient, s.opts.KubeClient
		return nil
	}
	api := newAPIServer(s.opts.KubeConfig, s.opts.KubeConfigSource)
	var err error
	if s.claims, s.slices, s.status, err = newClients(s.opts.KubeConfig, s.opts.KubeAPIQPS, s.opts.KubeAPIBurst, s.m, api.wrap); err != nil {
		return err
	}
	s.pr.setAPIServer(api.unreachable)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		api.report(ctx, func(ctx context.Context) error {
			return s.claims.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Error()
		})
	}()
	s.onStop(func() { cancel(); <-done; s.pr.setAPIServer(nil) })
	return nil
}

// startPublisher makes the publisher, the health wiring that sees its
// probes, taints what the monitors find and streams the health of what it
// published, and the watch for NVIDIA's device plugin, whose GPUs it
// leaves out (a change republishes).
func (s *server) startPublisher(ctx context.Context) error {
	s.health = newNodeHealth(s.cfg, s.opts.healthTimes)
	s.devicePlugin = deviceplugin.New(deviceplugin.Options{
		Dir: s.opts.DevicePluginDir, NodeName: s.opts.NodeName, Client: s.slices,
		Resources: s.cfg, Registry: s.m.registry,
	})
	s.pub = publish.New(publish.Options{
		NodeName: s.opts.NodeName, Client: s.slices, Config: s.cfg, Registry: s.m.registry,
		Hardware: s.node, Inventory: s.inv, Health: s.health, DevicePlugin: s.devicePlugin,
		RecheckFeatures: s.opts.FeatureCheck, Events: s.events(ctx),
	})
	s.onStop(s.pub.Stop)
	collector := healthCollector{s.health}
	s.m.registry.MustRegister(collector)
	s.onStop(func() { s.m.registry.Unregister(collector) })
	return s.devicePlugin.Start(ctx, s.pub.Poke)
}

// buildDrivers opens the NRI plugin (the NIC driver moves VFs into pods
// through it) and builds the node's drivers, each reconciling its
// checkpoint with the hardware. Then the publisher probes once through
// their unclaimed views, before any plugin serves, so that the first
// prepare finds its device in the catalog of what the hardware can
// deliver.
func (s *server) buildDrivers(ctx context.Context) error {
	s.cdiHook = s.installHook(ctx)
	var err error
	s.nodePods = newNodePods(s.claims, s.opts.NodeName)
	if s.pods, err = newPodNetwork(ctx, s.opts, s.status, s.nodePods, s.node, s.inv, s.m, lazyEvents{s, ctx}); err != nil {
		return err
	}
	s.gpuStatus = gpuClaimStatus(ctx, s.cfg, s.status, s.m)
	if s.drivers, err = s.newDrivers(ctx, s.inv, s.pods.network()); err != nil {
		return err
	}
	if s.drivers.GPU == nil && s.drivers.NIC == nil && !s.node.NVMLPending() {
		klog.FromContext(ctx).Info("No GPUs and no SR-IOV NICs on this node: nothing to serve; waiting for termination")
	}
	s.pub.Refresh(ctx)
	return nil
}

// newDrivers builds the drivers of the hardware in inv; the publisher
// probes through the GPU driver's unclaimed view from now on.
func (s *server) newDrivers(ctx context.Context, inv hw.Inventory, network nicprep.PodNetwork) (Drivers, error) {
	d, err := NewDrivers(ctx, s.node, inv, PluginOptions{
		StateDir:  s.opts.StateDir,
		CDIDir:    s.opts.CDIDir,
		Published: s.pub,
		Config:    s.cfg,
		NodeName:  s.opts.NodeName,
		Errors:    s.pub,
		Cluster:   nodeClaims{s.claims, s.opts.NodeName},
		Network:   network,
		CDIHook:   s.cdiHook,
		MPSCgroup: s.opts.MPSCgroup,
		GPUStatus: s.gpuStatus,
	})
	if err != nil {
		return Drivers{}, err
	}
	if d.GPU != nil {
		s.pub.AddUnclaimed(d.GPU.Unclaimed)
	}
	return d, nil
}

// installHook makes nvidia-cdi-hook available on the node for the hooks of
// the driver files generated for containers: the one given, or the one
// the agent's image ships, installed into the state directory (a node
// path at the same path here); "" where there is none (the driver files
// then say what containers lack).
func (s *server) installHook(ctx context.Context) string {
	if s.opts.CDIHook != "" {
		return s.opts.CDIHook
	}
	path, err := driverlibs.InstallHook(filepath.Join(s.opts.StateDir, "bin"))
	if err != nil {
		klog.FromContext(ctx).Error(err, "Installing the CDI hook: containers' driver libraries get no soname links or ld cache")
	}
	return path
}

// startPlugins starts each driver's kubelet plugin and publishes its pool.
func (s *server) startPlugins(ctx context.Context) error {
	if d := s.drivers.GPU; d != nil {
		if err := startDriver(ctx, s, &d.Driver); err != nil {
			return err
		}
	}
	if d := s.drivers.NIC; d != nil {
		if err := startDriver(ctx, s, &d.Driver); err != nil {
			return err
		}
	}
	return nil
}

// startNRI connects the NRI plugin to the container runtime: until it
// has, NIC claims are refused. Serving stops only once it has stopped, so
// that a newer agent never meets it still connected.
func (s *server) startNRI(ctx context.Context) {
	s.pods.run(ctx, s.drivers.NIC)
	s.onStop(s.pods.wait)
}

// startHealth starts the health monitors of the hardware the node has,
// and the police of the GPU shares.
func (s *server) startHealth(ctx context.Context) {
	if len(s.inv.PFs) > 0 {
		s.health.startNIC(ctx, s.node)
	}
	if gpu := s.node.GPU(); gpu != nil && len(s.inv.GPUs) > 0 {
		s.health.startGPU(ctx, gpu)
	}
	if d := s.drivers.GPU; d != nil {
		s.health.startMPS(ctx, d.MPS)
		s.startPolicing(ctx, d)
	}
}

// awaitNVML: where the PCI bus shows NVIDIA GPUs but NVML is not up (a
// driver container still starting), the GPU driver starts once it is,
// without an agent restart.
func (s *server) awaitNVML(ctx context.Context) {
	if !s.node.NVMLPending() {
		return
	}
	go waitNVML(ctx, s.node, s.startLateGPU)
}

// startLateGPU starts the GPU driver once NVML is up: its plugin, its
// pool and its health monitor.
func (s *server) startLateGPU(ctx context.Context) error {
	if !s.pub.Refresh(ctx) {
		return ctx.Err()
	}
	inv, _ := s.pub.Current()
	if len(inv.GPUs) == 0 {
		return errors.New("NVML is up but shows no GPU")
	}
	d, err := s.newDrivers(ctx, hw.Inventory{GPUs: inv.GPUs, PassthroughGPUs: inv.PassthroughGPUs}, nil)
	if err != nil {
		return err
	}
	if d.GPU == nil {
		return errors.New("NVML is up but the node has no GPU backend")
	}
	if err := startDriver(ctx, s, &d.GPU.Driver); err != nil {
		return err
	}
	s.health.startGPU(ctx, s.node.GPU())
	s.health.startMPS(ctx, d.GPU.MPS)
	s.startPolicing(ctx, d.GPU)
	s.setPodMetricsGPU(d.GPU)
	s.pub.Poke()
	return nil
}

// publish publishes the served drivers' pools now that their plugins
// serve (a pod the scheduler places here right away finds its driver)
// and the node's status shows whether NVIDIA's device plugin has the GPUs,
// says the agent serves, and keeps publishing until ctx ends. First it
// checks which DRA features the API server keeps: slices stored while a
// gate was on keep that gate's fields through updates, and a scheduler
// with the gate off ignores the whole pool, so the first publication must
// already be without them.
func (s *server) publish(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if s.devicePlugin.WaitSynced(ctx) != nil {
		return
	}
	if err := s.pub.CheckFeatures(ctx); err != nil {
		logger.Info("Warning: publishing the full device model unchecked; checking again in 30s", "err", err)
	}
	if err := s.pub.Publish(ctx); err != nil {
		logger.Error(err, "Publishing devices")
	}
	// The start's garbage (the probes, every driver's slices built and
	// copied, the informers' first lists) is most of the heap by now and
	// would stay resident until the heap doubles: collect it and hand it
	// back to the system once, rather than carry it for the pod's life.
	debug.FreeOSMemory()
	go s.checkStatusAuth(ctx, s.opts.FeatureCheck)
	degraded := func() error { return errors.Join(s.pub.Degraded(), s.claimLimit(ctx), s.statusAuth.warning()) }
	_ = degraded() // told at once, not at the first probe
	s.pr.serving(s.pub.Verified, s.pods.ready(), degraded, s.pub.Withheld)
	s.pub.Run(ctx, s.opts.Rescan, s.health.republish)
	logger.Info("Shutting down")
}

// onStop registers what stopping undoes. Once stopped, it runs at once (a
// late GPU driver started as the agent stopped).
func (s *server) onStop(f func()) {
	s.mu.Lock()
	if !s.stopped {
		s.stops = append(s.stops, f)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	f()
}

// stop undoes the steps, the last first.
func (s *server) stop() {
	s.mu.Lock()
	stops := s.stops
	s.stops, s.stopped = nil, true
	s.mu.Unlock()
	for i := len(stops) - 1; i >= 0; i-- {
		stops[i]()
	}
}

// waitNVML retries a pending NVML with backoff, warning until it comes,
// then starts the GPU driver (start) without an agent restart.
func waitNVML(ctx context.Context, node *backend.Node, start func(context.Context) error) {
	logger := klog.FromContext(ctx)
	backoff := time.Second
	for {
		err := node.InitNVML()
		if err == nil {
			logger.Info("NVML is available now: starting the GPU driver")
			if err := start(ctx); err != nil {
				logger.Error(err, "Starting the GPU driver")
			}
			return
		}
		logger.Info("Warning: the PCI bus shows NVIDIA GPUs but NVML is unavailable (is the driver container ready?): no GPU driver yet", "err", err, "retryIn", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Minute)
	}
}
