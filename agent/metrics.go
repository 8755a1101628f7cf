package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
)

// metrics are the agent's Prometheus metrics, on their own registry so
// that tests can start several agents in one process.
type metrics struct {
	registry  *prometheus.Registry
	claims    *prometheus.HistogramVec
	writes    *prometheus.CounterVec
	devices   *prometheus.GaugeVec
	fallbacks *prometheus.GaugeVec
	// API clients (see newClients).
	throttled    *prometheus.CounterVec
	throttleWait *prometheus.HistogramVec
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		claims: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hwdra_claim_operation_duration_seconds",
			Help:    "Time to prepare or unprepare one claim, by driver, operation and result.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"driver", "operation", "result"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hwdra_resource_publications_total",
			Help: "Times a driver's ResourceSlices were republished because the devices changed.",
		}, []string{"driver"}),
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hwdra_published_devices",
			Help: "Devices in a driver's published ResourceSlices.",
		}, []string{"driver"}),
		fallbacks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hwdra_feature_disabled",
			Help: "1 when the API server dropped fields of this DRA feature and the agent fell back to a model without it.",
		}, []string{"feature"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hwdra_api_client_throttled_requests_total",
			Help: "API requests that waited for the client's rate limiter (--kube-api-qps, --kube-api-burst), by client: claims (prepare) or slices (publishing).",
		}, []string{"client"}),
		throttleWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "hwdra_api_client_throttle_wait_seconds",
			Help:    "Time throttled API requests waited for the client's rate limiter, by client.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}, []string{"client"}),
	}
	m.registry.MustRegister(m.claims, m.writes, m.devices, m.fallbacks, m.throttled, m.throttleWait,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// sliceWrites reports the ResourceSlice controllers' API writes.
type sliceWrites struct{ p *publisher }

var sliceWritesDesc = prometheus.NewDesc("hwdra_resourceslice_writes_total",
	"ResourceSlice creates, updates and deletes the agent sent to the API server, by driver and operation.",
	[]string{"driver", "operation"}, nil)

func (c sliceWrites) Describe(ch chan<- *prometheus.Desc) { ch <- sliceWritesDesc }

func (c sliceWrites) Collect(ch chan<- prometheus.Metric) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	for driver, ctrl := range c.p.controllers {
		st := ctrl.GetStats()
		for op, n := range map[string]int64{"create": st.NumCreates, "update": st.NumUpdates, "delete": st.NumDeletes} {
			ch <- prometheus.MustNewConstMetric(sliceWritesDesc, prometheus.CounterValue, float64(n), driver, op)
		}
	}
}

// observe records one claim operation.
func (m *metrics) observe(driver, op string, start time.Time, err error) {
	result := "success"
	if err != nil {
		result = "error"
	}
	m.claims.WithLabelValues(driver, op, result).Observe(time.Since(start).Seconds())
}

// serve exposes /metrics and /healthz on addr until ctx ends.
func (m *metrics) serve(ctx context.Context, addr string) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Metrics server")
		}
	}()
	klog.FromContext(ctx).Info("Serving metrics", "address", ln.Addr().String())
	return nil
}
