// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// metrics are the publisher's Prometheus metrics. Every one is listed in
// the operator guide (docs/operator-guide.md, Metrics), which the agent's
// TestMetricsAsDocumented checks against a scrape.
type metrics struct {
	rescans      prometheus.Counter
	publications *prometheus.CounterVec
	devices      *prometheus.GaugeVec
	fallbacks    *prometheus.GaugeVec
	withheld     prometheus.Gauge
	refusals     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, p *Publisher) *metrics {
	m := &metrics{
		rescans: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hwdra_rescans_total",
			Help: "Rescans Run completed: the node probed and what changed handed to the API (every --rescan-interval, when poked and on a health change).",
		}),
		publications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hwdra_resource_publications_total",
			Help: "Times a driver's ResourceSlices were republished because the devices changed.",
		}, []string{"driver"}),
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hwdra_published_devices",
			Help: "Devices in a driver's published ResourceSlices, by kind.",
		}, []string{"driver", "kind"}),
		fallbacks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hwdra_feature_disabled",
			Help: "1 when the API server dropped fields of this DRA feature and the agent fell back to a model without it.",
		}, []string{"feature"}),
		withheld: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hwdra_device_plugin_gpus",
			Help: "GPUs of the node the agent leaves to NVIDIA's device plugin and does not publish: all while it sees the plugin serve GPUs, else those devicePlugin.ownedGPUs does not give the agent.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hwdra_resourceslice_refusals_total",
			Help: "ResourceSlice writes of a driver the API server (or the slice library's validation) refused for good: an admission policy or webhook, a quota, an invalid or too large object. The agent is unready and a Warning Event ResourceSlicesRefused on the Node names the cause.",
		}, []string{"driver"}),
	}
	// Series that exist from the start, so a dashboard sees zeros rather
	// than nothing.
	for _, g := range gates {
		m.fallbacks.WithLabelValues(g.name)
	}
	reg.MustRegister(m.rescans, m.publications, m.devices, m.fallbacks, m.withheld, m.refusals, sliceWrites{p})
	return m
}

// sliceWrites reports the ResourceSlice controllers' API writes.
type sliceWrites struct{ p *Publisher }

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

// Device kinds, the "kind" label of the publisher's and the agent's
// metrics: a GPU device's gpu.hwdra.io/type (gpu, mig, vgpu), or for a NIC
// a PF offered in shares or one VF.
const (
	KindUnknown = "unknown"
	kindVFShare = "vf-share"
	kindVF      = "vf"
)

// deviceKind is a published device's kind.
func deviceKind(driver string, d *resourceapi.Device) string {
	switch driver {
	case device.GPUDriver:
		if a, ok := d.Attributes[device.AttrType]; ok && a.StringValue != nil {
			return *a.StringValue
		}
	case device.NICDriver:
		if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
			return kindVFShare
		}
		return kindVF
	}
	return KindUnknown
}

// countKinds records the kind of every published device of a driver and
// sets the published-devices gauges.
func (p *Publisher) countKinds(driver string, res resourceslice.DriverResources) {
	kinds := map[string]string{}
	count := map[string]int{}
	for _, pool := range res.Pools {
		for _, s := range pool.Slices {
			for i := range s.Devices {
				k := deviceKind(driver, &s.Devices[i])
				kinds[s.Devices[i].Name] = k
				count[k]++
			}
		}
	}
	p.mu.Lock()
	p.kinds[driver] = kinds
	p.mu.Unlock()
	p.metrics.devices.DeletePartialMatch(prometheus.Labels{"driver": driver})
	for k, n := range count {
		p.metrics.devices.WithLabelValues(driver, k).Set(float64(n))
	}
}

// KindOf is a published device's kind (KindUnknown for a device not
// published).
func (p *Publisher) KindOf(driver, device string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k, ok := p.kinds[driver][device]; ok {
		return k
	}
	return KindUnknown
}
