// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// h100Model is what dcgm-exporter's modelName says of an H100 SXM 80GB.
const h100Model = "NVIDIA H100 80GB HBM3"

// TestPrometheusGPUsByPod: where operators look. A real Prometheus
// scrapes the agent pod (as the chart's PodMonitor does: honorLabels, the
// node's name as node) and a stand-in serving dcgm-exporter's series for
// the mock GPUs, and evaluates the chart's own PrometheusRule. Pods with a
// whole GPU, a MIG partition and a GPU share run, each with a process on
// its GPU; through Prometheus's HTTP API the recording rules give each
// pod's dcgm-exporter series its namespace and pod (the whole GPU's and
// the share's by the GPU's UUID, the MIG partition's by its GPU instance
// ID too), the agent's own series give each pod its GPU memory and the
// share its use of its share, and every query of the chart's dashboard
// is valid PromQL with data. An XID injected on the MIG pod's GPU
// (`hwdra mock inject`) fires HwdraDeviceUnhealthy.
func TestPrometheusGPUsByPod(t *testing.T) {
	if os.Getenv(framework.EnvPrometheus) == "" {
		t.Skipf("%s is not set (hack/e2e-realnode.sh sets it to what hack/build-prometheus.sh prints)", framework.EnvPrometheus)
	}
	s, mockDir, _ := startLastingAgentPodWith(t, "prometheus", threeH100, nil) // a GPU each for a whole-GPU pod, a MIG pod and a share
	whole := s.runPod("whole", s.template(exampleClaim(t, "gpu-full.yaml")), "prometheus-whole-pod")
	mig := s.runPod("mig", s.template(exampleClaim(t, "mig-1g.10gb.yaml")), "prometheus-mig-pod")
	share := s.runSharePod("share", "10Gi", "30", "")
	gpus := map[string]string{}
	for name, r := range map[string]ran{"whole": whole, "mig": mig, "share": share} {
		res := r.claim.Status.Allocation.Devices.Results[0]
		dev, err := s.n.PublishedDevice(s.ctx, res.Driver, res.Pool, res.Device)
		if err != nil {
			t.Fatal(err)
		}
		gpus[name] = sliceAttr(dev, "resource.kubernetes.io/pciBusID")
	}
	listProcesses(t, mockDir, gpus["whole"], fmt.Sprintf("%d:30Gi", appPID(t, whole)))
	listProcesses(t, mockDir, gpus["mig"], fmt.Sprintf("%d:3Gi", appPID(t, mig)))
	listProcesses(t, mockDir, gpus["share"], fmt.Sprintf("%d:5Gi:mps", appPID(t, share)))
	st, err := persist.ReadState(mockDir)
	if err != nil {
		t.Fatal(err)
	}
	uuid, gi := map[string]string{}, ""
	for name, bus := range gpus {
		for _, g := range st.GPUs {
			if g.BusID == bus {
				uuid[name] = g.UUID
				if name == "mig" && len(g.GPUInstances) == 1 {
					gi = fmt.Sprint(g.GPUInstances[0].ID)
				}
			}
		}
	}
	if gi == "" || len(uuid) != 3 {
		t.Fatalf("mock state: GPUs %v, UUIDs %v, MIG pod's GPU instance %q", gpus, uuid, gi)
	}

	rules, err := s.n.ChartRules(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	dcgm := framework.StartDCGMStandIn(t, mockDir, s.n.Name, h100Model)
	prom := s.n.StartPrometheus(t, []framework.ScrapeTarget{
		{Job: "hwdra-agent", Address: framework.AgentAddr, HonorLabels: true, Labels: map[string]string{"node": s.n.Name}},
		{Job: "dcgm-exporter", Address: dcgm.Addr},
	}, rules)
	began := time.Now()

	// Each pod's dcgm-exporter series, by the recording rules.
	for _, c := range []struct {
		pod, record string
		labels      map[string]string
	}{
		{"whole", "hwdra_pod:DCGM_FI_DEV_GPU_UTIL", map[string]string{"UUID": uuid["whole"], "GPU_I_ID": "", "type": "gpu", "modelName": h100Model}},
		{"mig", "hwdra_pod:DCGM_FI_DEV_FB_USED", map[string]string{"UUID": uuid["mig"], "GPU_I_ID": gi, "GPU_I_PROFILE": "1g.10gb", "type": "mig"}},
		{"mig", "hwdra_pod:DCGM_FI_PROF_GR_ENGINE_ACTIVE", map[string]string{"UUID": uuid["mig"], "GPU_I_ID": gi}},
		{"share", "hwdra_pod:DCGM_FI_DEV_GPU_UTIL", map[string]string{"UUID": uuid["share"], "GPU_I_ID": "", "type": "share", "sharing": "share"}},
	} {
		q := fmt.Sprintf(`%s{namespace=%q, pod=%q}`, c.record, s.ns, c.pod)
		v, err := prom.WaitQuery(s.ctx, q, 60*time.Second, func(v model.Vector) bool { return len(v) == 1 })
		if err != nil {
			t.Fatal(err)
		}
		for k, want := range c.labels {
			if got := string(v[0].Metric[model.LabelName(k)]); got != want {
				t.Errorf("%s: %s=%q, want %q (%v)", q, k, got, want, v[0].Metric)
			}
		}
		t.Logf("%s = %v", v[0].Metric, v[0].Value)
	}
	framework.Timing(t, "prometheus-start-to-joined-series", time.Since(began))

	// The agent's own: each pod's GPU memory, the share's use of its share.
	for q, want := range map[string]float64{
		fmt.Sprintf(`hwdra_pod_gpu_memory_used_bytes{namespace=%q, pod="whole"}`, s.ns):       30 << 30,
		fmt.Sprintf(`hwdra_pod_gpu_memory_used_bytes{namespace=%q, pod="mig"}`, s.ns):         3 << 30,
		fmt.Sprintf(`hwdra_pod_gpu_memory_used_bytes{namespace=%q, pod="share"}`, s.ns):       5 << 30,
		fmt.Sprintf(`hwdra_pod:gpu_share_memory_used:ratio{namespace=%q, pod="share"}`, s.ns): 0.5,
	} {
		if _, err := prom.WaitQuery(s.ctx, q, 30*time.Second, func(v model.Vector) bool { return len(v) == 1 && float64(v[0].Value) == want }); err != nil {
			t.Error(err)
		}
	}

	checkDashboardQueries(t, s, prom)
	// With HWDRA_E2E_ARTIFACTS set: the share's use rises, and once
	// Prometheus holds 150 s of scrapes the panels' data is kept for
	// hack/render-dashboard.py.
	if dir := os.Getenv(framework.EnvArtifacts); dir != "" {
		listProcesses(t, mockDir, gpus["share"], fmt.Sprintf("%d:8Gi:mps", appPID(t, share)))
		if _, err := prom.WaitQuery(s.ctx, `count_over_time(up{job="hwdra-agent"}[10m]) >= 150`, 5*time.Minute, func(v model.Vector) bool { return len(v) == 1 }); err != nil {
			t.Fatal(err)
		}
		saveDashboardData(t, s, prom, began, filepath.Join(dir, "dashboard-data.json"))
	}

	// An XID on the MIG pod's GPU: the alert fires once it lasted its
	// minute.
	injected := time.Now()
	hwdraInject(t, mockDir, "xid", "--gpu", gpus["mig"], "--code", "79")
	a, err := prom.WaitAlert(s.ctx, "HwdraDeviceUnhealthy", map[string]string{"node": s.n.Name, "pool": s.n.Name, "driver": gpuDriver}, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	framework.Timing(t, "prometheus-xid-to-alert-firing", time.Since(injected))
	t.Logf("alert %v: %s", a.Labels, a.Annotations["summary"])
	hwdraInject(t, mockDir, "clear", "--gpu", gpus["mig"])
	for _, bus := range gpus {
		listProcesses(t, mockDir, bus)
	}
}

// checkDashboardQueries runs every query of the chart's Grafana dashboard
// against Prometheus, its variables set to this node, namespace and every
// pod and GPU: each must be valid PromQL, and each panel that this node's
// pods feed must have data.
func checkDashboardQueries(t *testing.T, s *scenario, prom *framework.Prometheus) {
	t.Helper()
	chart, err := framework.ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(chart, "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var dash struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	// Panels of what this scenario does not do: VF traffic, failures and
	// refusals.
	idle := regexp.MustCompile(`^(VF traffic|Failed prepares|Share police and refused slices)`)
	vars := strings.NewReplacer(`"$node"`, fmt.Sprintf("%q", s.n.Name), `"$namespace"`, fmt.Sprintf("%q", s.ns), `"$pod"`, `".*"`, `"$gpu"`, `".*"`)
	queries := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			continue // a row
		}
		// Each query valid; the panel shows data (from any of its queries).
		hasData := func() bool {
			found := false
			for _, tg := range p.Targets {
				v, err := prom.Query(s.ctx, vars.Replace(tg.Expr))
				if err != nil {
					t.Errorf("dashboard panel %q: %v", p.Title, err)
					return true
				}
				found = found || len(v) > 0
			}
			return found
		}
		queries += len(p.Targets)
		if idle.MatchString(p.Title) {
			hasData()
			continue
		}
		if err := waitfor.Until(s.ctx, "data", 30*time.Second, hasData); err != nil {
			t.Errorf("dashboard panel %q: %v", p.Title, err)
		}
	}
	t.Logf("%d dashboard queries answered", queries)
}

// saveDashboardData writes, for each panel of the chart's dashboard, its
// queries' results over [from, now] (its variables set to this node and
// namespace; a panel repeated per GPU once per GPU): what
// hack/render-dashboard.py draws.
func saveDashboardData(t *testing.T, s *scenario, prom *framework.Prometheus, from time.Time, file string) {
	t.Helper()
	chart, err := framework.ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(chart, "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []map[string]any `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	gpuValues, err := prom.Query(s.ctx, fmt.Sprintf(`count by (UUID) (hwdra_claim_device_info{Hostname=%q, driver="gpu.hwdra.io"})`, s.n.Name))
	if err != nil {
		t.Fatal(err)
	}
	rng := promv1.Range{Start: from, End: time.Now(), Step: 2 * time.Second}
	var out []map[string]any
	for _, p := range dash.Panels {
		targets, _ := p["targets"].([]any)
		gpus := []string{".*"}
		if p["repeat"] == "gpu" {
			gpus = nil
			for _, v := range gpuValues {
				gpus = append(gpus, string(v.Metric["UUID"]))
			}
		}
		for _, gpu := range gpus {
			vars := strings.NewReplacer(`"$node"`, fmt.Sprintf("%q", s.n.Name), `"$namespace"`, fmt.Sprintf("%q", s.ns), `"$pod"`, `".*"`, `"$gpu"`, fmt.Sprintf("%q", gpu))
			var results []any
			for _, tg := range targets {
				m, _ := tg.(map[string]any)
				expr, _ := m["expr"].(string)
				res, _, err := prom.API.QueryRange(s.ctx, vars.Replace(expr), rng)
				if err != nil {
					t.Fatalf("panel %v: %v", p["title"], err)
				}
				results = append(results, map[string]any{"legendFormat": m["legendFormat"], "instant": m["instant"], "format": m["format"], "result": res})
			}
			title := strings.ReplaceAll(fmt.Sprint(p["title"]), "$gpu", gpu)
			out = append(out, map[string]any{"title": title, "type": p["type"], "gridPos": p["gridPos"], "fieldConfig": p["fieldConfig"], "targets": results})
		}
	}
	b, err := json.Marshal(map[string]any{"node": s.n.Name, "namespace": s.ns, "from": from, "to": rng.End, "panels": out})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("dashboard data of %d panels in %s", len(out), file)
}
