// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package agent is the node agent: it opens the hardware, runs one kubelet
// plugin per driver that has hardware on the node (drivers.go, plugins.go),
// has the publisher keep the node's ResourceSlices equal to what the
// hardware offers (package publish), streams device health (health.go),
// moves VFs into pods through NRI (nri.go), answers probes (probes.go) and
// hands the node over in a rolling update (handover.go). serve.go puts it
// together, step by step; loop.go says which part calls which through
// which interface.
package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/backend"
)

// Options are the agent's settings (its command-line flags).
type Options struct {
	NodeName   string
	Hardware   string
	ConfigPath string
	// KubeConfig reaches the API server; each of the agent's three clients
	// (claims, slices, status) may send KubeAPIQPS requests a second, in bursts of
	// KubeAPIBurst.
	KubeConfig *rest.Config
	// KubeConfigSource says where KubeConfig came from ("--kubeconfig
	// F", "in-cluster service account"), for the messages that say the
	// API server is unreachable.
	KubeConfigSource string
	KubeAPIQPS       float32
	KubeAPIBurst     int
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
	// FeatureCheck is how often the publisher checks which DRA features'
	// fields the API server keeps (one dry-run create each); 0: 10 min.
	FeatureCheck time.Duration
	// MetricsAddress serves /metrics and /healthz; empty: off.
	MetricsAddress string
	// MetricsBindAddress, an IP address, replaces MetricsAddress's host
	// (which must then be empty): the node's IP, where the kubelet
	// probes and Prometheus scrapes, rather than every interface.
	MetricsBindAddress string
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
	// CDIHook is nvidia-cdi-hook as the node's container runtime runs it,
	// for the hooks of the driver files generated for containers; empty:
	// the one the agent's image ships, installed into StateDir/bin.
	CDIHook string
	// MPSCgroup is where the MPS control daemons of shared GPUs run: beside
	// the agent's pod in a DaemonSet, so that they outlive it.
	MPSCgroup mps.Cgroup
	// DevicePluginDir is the kubelet's device-plugin directory, where
	// NVIDIA's device plugin has its socket while it serves GPUs (the
	// agent then leaves them to it); empty: not watched.
	DevicePluginDir string
	// ClaimLimitGPUs is the most whole GPUs the chart's claim-limits
	// policy lets a claim ask for (claimLimits.gpusPerNode); 0: no
	// policy. A node with more GPUs warns (claimlimit.go).
	ClaimLimitGPUs int

	// node is hardware a test opened (Hardware is then ignored); the
	// test closes it.
	node *backend.Node
	// procRoot is where the share police and the per-pod metrics read
	// processes ("": /proc): a test's, that puts its processes in pods.
	procRoot string
	// healthTimes shortens the health checks and timeouts in tests; nil:
	// the agent's.
	healthTimes *healthTimes
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
	metricsAddr, err := metricsAddress(opts.MetricsAddress, opts.MetricsBindAddress)
	if err != nil {
		return err
	}
	m := newMetrics()
	pr := newProbes()
	m.registry.MustRegister(readiness(pr))
	listenCtx, stopListening := context.WithCancel(ctx)
	defer stopListening()
	listening := false
	listen := func() error {
		if listening || metricsAddr == "" {
			return nil
		}
		listening = true
		return m.serve(listenCtx, metricsAddr, pr)
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
	pr.setRequested(lock.requested)
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
