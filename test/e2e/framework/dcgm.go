// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/mock/persist"
)

// DCGMStandIn serves, for the mock GPUs of a mock hardware directory,
// what NVIDIA's dcgm-exporter prints for real ones, so that the chart's
// recording rules join on the labels it really has. Read from
// dcgm-exporter's rendermetrics template and collector (not copied):
// one series per GPU, or with MIG on per GPU instance, labelled gpu (its
// index), UUID (the physical GPU's, also on an instance's series),
// pci_bus_id (DCGM's form, 00000000:1B:00.0), device (nvidia<index>),
// modelName, for an instance GPU_I_PROFILE (its profile name) and
// GPU_I_ID (NVML's GPU instance ID), and Hostname (its NODE_NAME).
// Values: the framebuffer the mock's processes hold (MiB), the rest
// fixed. A test helper; nothing of it ships.
type DCGMStandIn struct {
	// Addr is where it serves /metrics.
	Addr    string
	mockDir string
	node    string
	model   string
}

// StartDCGMStandIn serves the stand-in's /metrics on a free loopback port
// until t ends: the GPUs of mockDir (read at each scrape), on node, of
// model (modelName).
func StartDCGMStandIn(t testing.TB, mockDir, node, model string) *DCGMStandIn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &DCGMStandIn{Addr: ln.Addr().String(), mockDir: mockDir, node: node, model: model}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", d.serve)
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return d
}

// dcgmField is one field dcgm-exporter exports (its default counters and
// DCGM_FI_PROF_GR_ENGINE_ACTIVE of dcp-metrics-included.csv).
type dcgmField struct {
	name, kind, help string
	// value is the field's value for an entity whose processes hold fbMiB.
	value func(fbMiB, totalMiB float64) float64
}

var dcgmFields = []dcgmField{
	{"DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", func(float64, float64) float64 { return 41 }},
	{"DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", func(fb, _ float64) float64 { return 70 + fb/1024 }},
	{"DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", func(fb, _ float64) float64 { return min(100, fb/256) }},
	{"DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", func(fb, _ float64) float64 { return min(100, fb/1024) }},
	{"DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", func(float64, float64) float64 { return 0 }},
	{"DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", func(fb, total float64) float64 { return max(0, total-fb) }},
	{"DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", func(fb, _ float64) float64 { return fb }},
	{"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.", func(fb, _ float64) float64 { return min(1, fb/40960) }},
}

// dcgmEntity is a GPU or a GPU instance as dcgm-exporter labels it.
type dcgmEntity struct {
	labels        string
	fbMiB, totMiB float64
}

func (d *DCGMStandIn) serve(w http.ResponseWriter, _ *http.Request) {
	st, err := persist.ReadState(d.mockDir)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var entities []dcgmEntity
	for i, g := range st.GPUs {
		base := fmt.Sprintf(`gpu="%d",UUID=%s,pci_bus_id=%s,device="nvidia%d",modelName=%s`,
			i, strconv.Quote(g.UUID), strconv.Quote(dcgmBusID(g.BusID)), i, strconv.Quote(d.model))
		host := ",Hostname=" + strconv.Quote(d.node)
		if !g.MIG.Current {
			entities = append(entities, dcgmEntity{labels: base + host, fbMiB: heldMiB(g, nil), totMiB: 81559})
			continue
		}
		// With MIG on, dcgm-exporter monitors the GPU instances.
		for _, gi := range g.GPUInstances {
			id := gi.ID
			entities = append(entities, dcgmEntity{
				labels: base + fmt.Sprintf(`,GPU_I_PROFILE=%s,GPU_I_ID="%d"`, strconv.Quote(gi.Profile), gi.ID) + host,
				fbMiB:  heldMiB(g, &id), totMiB: 81559 * float64(gi.Size) / 8,
			})
		}
	}
	var b strings.Builder
	for _, f := range dcgmFields {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.kind)
		for _, e := range entities {
			fmt.Fprintf(&b, "%s{%s} %g\n", f.name, e.labels, f.value(e.fbMiB, e.totMiB))
		}
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	_, _ = w.Write([]byte(b.String()))
}

// heldMiB is the framebuffer the GPU's listed processes hold, in MiB: on
// a GPU instance (gi set) those in it.
func heldMiB(g persist.GPUState, gi *int) float64 {
	var bytes uint64
	for _, p := range g.Processes {
		if p.UsedMemory == nil || gi != nil && (p.GPUInstance == nil || *p.GPUInstance != *gi) {
			continue
		}
		bytes += *p.UsedMemory
	}
	return float64(bytes) / (1 << 20)
}

// dcgmBusID writes a PCI address as DCGM does: an eight-digit domain, hex
// digits in upper case ("0000:1b:00.0" -> "00000000:1B:00.0").
func dcgmBusID(bus string) string {
	domain, rest, ok := strings.Cut(bus, ":")
	if !ok {
		return strings.ToUpper(bus)
	}
	return fmt.Sprintf("%08s:%s", strings.ToUpper(domain), strings.ToUpper(rest))
}
