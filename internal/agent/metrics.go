// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/endpoint"
	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/police"
	"github.com/hwdra/hwdra/internal/agent/publish"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// metrics are the agent's Prometheus metrics, on their own registry so
// that tests can start several agents in one process; the publisher adds
// its own (internal/agent/publish/metrics.go). Every one is listed in the operator
// guide (docs/operator-guide.md, Metrics), which TestMetricsAsDocumented
// checks against a scrape.
type metrics struct {
	registry *prometheus.Registry
	claims   *prometheus.HistogramVec
	// API clients (see newClients).
	throttled    *prometheus.CounterVec
	throttleWait *prometheus.HistogramVec
	// NRI: hook latency and the claim status the hooks write.
	hooks        *prometheus.HistogramVec
	statusWrites *prometheus.CounterVec
	// The share police: what it found and did, and what a round costs.
	shareFindings *prometheus.CounterVec
	shareChecks   prometheus.Histogram
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		claims: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hwdra_claim_operation_duration_seconds",
			Help:    "Time to prepare or unprepare one claim, by driver, operation, kind of its devices (gpu, mig, vgpu, vf-share, vf; mixed for several) and result.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"driver", "operation", "kind", "result"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hwdra_api_client_throttled_requests_total",
			Help: "API requests that waited for the client's rate limiter (--kube-api-qps, --kube-api-burst), by client: claims (prepare), slices (publishing) or status (claim status writes).",
		}, []string{"client"}),
		throttleWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hwdra_api_client_throttle_wait_seconds",
			Help:    "Time throttled API requests waited for the client's rate limiter, by client.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}, []string{"client"}),
		hooks: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hwdra_nri_hook_duration_seconds",
			Help:    "Time the NRI plugin took to answer the container runtime, by hook (RunPodSandbox, StopPodSandbox, RemovePodSandbox, Synchronize) and result; the runtime waits for it (containerd drops a plugin after 2 s).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 13),
		}, []string{"hook", "result"}),
		statusWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hwdra_claim_status_writes_total",
			Help: "ResourceClaim status.devices write requests (GPU entries after prepare, VF network data at pod start and stop), by driver and result: success, refused (forbidden or invalid: not retried), gone (claim deleted, replaced or deallocated), error (retried).",
		}, []string{"driver", "result"}),
		shareFindings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hwdra_gpu_share_violations_total",
			Help: "Processes the share police acted on, by reason (GPUShareMemoryOverrun, GPUShareLimitsRaised, GPUProcessOutsideMPS, GPUProcessWithoutClaim, GPUProcessOutsideKubernetes) and action (stopped, reported, stop-failed); gpus.shares.overuse decides stop or report.",
		}, []string{"reason", "action"}),
		shareChecks: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hwdra_gpu_share_check_duration_seconds",
			Help:    "Time one round of the share police took over the node's GPUs that serve shares (every gpus.shares.checkIntervalMilliseconds).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14),
		}),
	}
	// Series that exist from the start, so a dashboard sees zeros rather
	// than nothing.
	for _, c := range []string{clientClaims, clientSlices, clientStatus} {
		m.throttled.WithLabelValues(c)
		m.throttleWait.WithLabelValues(c)
	}
	for _, d := range []string{device.GPUDriver, device.NICDriver} {
		for _, r := range []string{metadata.WriteSuccess, metadata.WriteRefused, metadata.WriteGone, metadata.WriteError} {
			m.statusWrites.WithLabelValues(d, r)
		}
	}
	for _, r := range police.Reasons {
		for _, a := range []string{police.ActionStopped, police.ActionReported} {
			if r != police.OutsideKubernetes || a == police.ActionReported {
				m.shareFindings.WithLabelValues(string(r), a)
			}
		}
	}
	m.registry.MustRegister(m.claims, m.throttled, m.throttleWait, m.hooks, m.statusWrites, m.shareFindings, m.shareChecks,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

const (
	resultSuccess = "success"
	resultError   = "error"
)

func result(err error) string {
	if err != nil {
		return resultError
	}
	return resultSuccess
}

// kindMixed is the kind of a claim with devices of several kinds (the
// devices' kinds are the publisher's: publish.Publisher.KindOf).
const kindMixed = "mixed"

// claimKind is the kind of a claim's devices: theirs when they share one,
// mixed otherwise, unknown without any.
func claimKind(kinds []string) string {
	out := ""
	for _, k := range kinds {
		switch {
		case out == "":
			out = k
		case out != k:
			return kindMixed
		}
	}
	if out == "" {
		return publish.KindUnknown
	}
	return out
}

// ObserveHook records one NRI hook (podnet.HookObserver).
func (m *metrics) ObserveHook(hook string, took time.Duration, err error) {
	m.hooks.WithLabelValues(hook, result(err)).Observe(took.Seconds())
}

// Found counts a process the share police acted on (police.Observer).
func (m *metrics) Found(reason police.Reason, action string) {
	m.shareFindings.WithLabelValues(string(reason), action).Inc()
}

// Checked records one round of the share police (police.Observer).
func (m *metrics) Checked(_ int, took time.Duration) { m.shareChecks.Observe(took.Seconds()) }

// ObserveStatusWrite counts one claim status write request
// (metadata.WriteObserver).
func (m *metrics) ObserveStatusWrite(driver, result string) {
	m.statusWrites.WithLabelValues(driver, result).Inc()
}

// deviceHealthDesc: one series per device and state, 1 for the device's
// state now (as kube-state-metrics does for pod phases).
var deviceHealthDesc = prometheus.NewDesc("hwdra_device_health_state",
	"1 for each published device's health as reported to the kubelet (Healthy, Unhealthy, Unknown), 0 for the other states.",
	[]string{"driver", "pool", "device", "state"}, nil)

// gpuEventsDesc: the GPU health monitor's NVML events
// (health.GPUMonitor.Events).
var gpuEventsDesc = prometheus.NewDesc("hwdra_gpu_health_events_total",
	"NVML events (XIDs, double-bit ECC errors, GPUs lost, recovery actions) the GPU health monitor judged, device failures or not.",
	nil, nil)

// healthCollector reports each driver's devices from its health stream,
// and the events the GPU monitor judged.
type healthCollector struct{ h *nodeHealth }

func (c healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- deviceHealthDesc
	ch <- gpuEventsDesc
}

func (c healthCollector) Collect(ch chan<- prometheus.Metric) {
	c.h.mu.Lock()
	gpu := c.h.gpu
	c.h.mu.Unlock()
	if gpu != nil {
		ch <- prometheus.MustNewConstMetric(gpuEventsDesc, prometheus.CounterValue, float64(gpu.Events()))
	}
	states := []kubeletplugin.HealthStatus{kubeletplugin.HealthStatusHealthy, kubeletplugin.HealthStatusUnhealthy, kubeletplugin.HealthStatusUnknown}
	for _, driver := range c.h.drivers() {
		for _, dev := range c.h.stream(driver).States() {
			for _, st := range states {
				v := 0.0
				if dev.Health == st {
					v = 1
				}
				ch <- prometheus.MustNewConstMetric(deviceHealthDesc, prometheus.GaugeValue, v, driver, dev.Pool, dev.Name, string(st))
			}
		}
	}
}

// observe records one claim operation.
func (m *metrics) observe(driver, op, kind string, start time.Time, err error) {
	m.claims.WithLabelValues(driver, op, kind, result(err)).Observe(time.Since(start).Seconds())
}

// serve exposes /metrics, /healthz and /readyz on addr until ctx ends,
// within the endpoint's limits (the port is on the node's network).
func (m *metrics) serve(ctx context.Context, addr string, pr *probes) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", pr.handler(pr.alive, nil))
	mux.HandleFunc("/readyz", pr.handler(pr.ready, pr.notes))
	ln, err := listenShared(ctx, addr)
	if err != nil {
		return err
	}
	endpoint.Serve(ctx, ln, mux, endpoint.DefaultLimits)
	klog.FromContext(ctx).Info("Serving metrics", "address", ln.Addr().String())
	return nil
}

// metricsAddress is where the agent serves metrics and probes:
// --metrics-address, its host replaced by --metrics-bind-address where
// that is set (the chart passes the node's IP: status.hostIP).
func metricsAddress(addr, bind string) (string, error) {
	if addr == "" || bind == "" {
		return addr, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--metrics-address %q: %w", addr, err)
	}
	if net.ParseIP(bind) == nil {
		return "", fmt.Errorf("--metrics-bind-address %q: not an IP address", bind)
	}
	if host != "" {
		return "", fmt.Errorf("--metrics-bind-address %q and --metrics-address %q both name a host: give the port alone to --metrics-address (\":%s\")", bind, addr, port)
	}
	return net.JoinHostPort(bind, port), nil
}
