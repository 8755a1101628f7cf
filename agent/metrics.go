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
	}
	m.registry.MustRegister(m.claims, m.writes, m.devices, m.fallbacks,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
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
