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
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
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
	// PodUID is the agent's pod (a DaemonSet's, from the downward API):
	// its kubelet plugins register for rolling updates
	// (kubeletplugin.RollingUpdate), under sockets of their own beside an
	// older pod's. Empty: fixed socket names.
	PodUID string
	// DriverRoot is the NVIDIA driver's root on "host" hardware.
	DriverRoot backend.DriverRoot

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

// Run runs the agent until ctx is cancelled. It serves the node once it
// holds the state directory (handover.go): an agent started beside a
// serving one (a rolling update) asks it to hand over and waits; an agent
// asked to hand over stops serving and waits for termination.
func Run(ctx context.Context, opts Options) error {
	logger := klog.FromContext(ctx)
	cfg, err := config.Load(opts.ConfigPath)
	if err != nil {
		return err
	}
	m := newMetrics()
	pr := newProbes()
	listenCtx, stopListening := context.WithCancel(ctx)
	defer stopListening()
	listening := false
	listen := func() error {
		if listening || opts.MetricsAddress == "" {
			return nil
		}
		listening = true
		return m.serve(listenCtx, opts.MetricsAddress, pr)
	}
	id := opts.PodUID
	if id == "" {
		id = "pid " + strconv.Itoa(os.Getpid())
	}
	// Waiting, the agent answers probes (alive, not ready) at once.
	var listenErr error
	lock, err := lockState(ctx, opts.StateDir, id, func() { listenErr = listen() })
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if err := errors.Join(listenErr, listen()); err != nil {
		lock.release()
		return fmt.Errorf("metrics: %w", err)
	}
	serveCtx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	handedOver := make(chan string, 1)
	pr.requested = lock.requested
	go lock.watch(serveCtx, func(by string) {
		logger.Info("A newer agent asks for the node: handing over", "to", by)
		pr.setState(stateHandingOver)
		handedOver <- by
		stopServing()
	})
	pr.setState(stateStarting)
	err = serve(serveCtx, opts, cfg, m, pr)
	stopServing()
	lock.release()
	select {
	case by := <-handedOver:
		pr.setState(stateHandedOver)
		stopListening()
		logger.Info("Handed the node over; waiting for termination", "to", by, "err", err)
		<-ctx.Done()
		return nil
	default:
		return err
	}
}

// serve serves the node until ctx ends.
func serve(ctx context.Context, opts Options, cfg *config.AgentConfig, m *metrics, pr *probes) error {
	logger := klog.FromContext(ctx)
	var err error
	node := opts.node
	if node == nil {
		if node, err = backend.OpenWith(opts.Hardware, backend.Options{DriverRoot: opts.DriverRoot}); err != nil {
			return err
		}
		defer func() {
			if err := node.Close(); err != nil {
				logger.Error(err, "Closing hardware")
			}
		}()
	}

	claimClient, sliceClient := opts.KubeClient, opts.KubeClient
	if claimClient == nil {
		if claimClient, sliceClient, err = newClients(opts.KubeConfig, opts.KubeAPIQPS, opts.KubeAPIBurst, m); err != nil {
			return err
		}
	}
	pub := newPublisher(opts.NodeName, sliceClient, cfg, m)
	if opts.featureRecheck > 0 {
		pub.recheckEvery = opts.featureRecheck
	}
	defer pub.stop()
	hs := newNodeHealth(pub, cfg)
	m.registry.MustRegister(healthCollector{hs})
	defer m.registry.Unregister(healthCollector{hs})
	go pub.verifyLoop(ctx)
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
		helper, err := startPlugin(ctx, opts, claimClient, d, m, hs, pub.kindOf)
		if err != nil {
			return err
		}
		pr.addPlugin(d.Name, registrarSocket(opts.RegistrarDir, d.Name, opts.PodUID), helper)
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
	defer pods.wait()
	// Published once the plugins serve: a pod the scheduler places here
	// right away finds its driver.
	if err := pub.publishCurrent(ctx); err != nil {
		logger.Error(err, "Publishing devices")
	}
	pr.serving(pub, pods.ready())
	pub.run(ctx, opts.Rescan, nil)
	logger.Info("Shutting down")
	return nil
}

// startPlugin starts a driver's kubelet plugin, with its health stream.
func startPlugin(ctx context.Context, opts Options, client kubernetes.Interface, d Driver, m *metrics, hs *nodeHealth, kindOf func(driver, device string) string) (*kubeletplugin.Helper, error) {
	// The kubelet owns the plugins directory; each driver its own
	// subdirectory (socket, metadata files).
	dataDir := filepath.Join(opts.PluginsDir, d.Name)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return nil, err
	}
	options := []kubeletplugin.Option{
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
	}
	if opts.PodUID != "" {
		// Sockets named after the pod, beside those of an older pod in a
		// rolling update: neither removes the other's.
		// The library names the DRA socket dra-<pod UID>.sock, which with
		// a long kubelet root overflows a unix socket path (108 bytes):
		// the UID's first, random, 8 characters tell two pods apart.
		options = append(options, kubeletplugin.RollingUpdate(types.UID(opts.PodUID)),
			kubeletplugin.PluginSocket("dra-"+opts.PodUID[:min(8, len(opts.PodUID))]+".sock"))
	}
	helper, err := kubeletplugin.Start(ctx, withHealth(observed(d, m, kindOf), hs.stream(d.Name)), options...)
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
