package agent

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// documentedMetric is a row of the operator guide's metrics table.
type documentedMetric struct {
	name, kind string
	labels     []string
}

// readmeMetrics reads the table under "## Metrics" in the operator guide
// (docs/operator-guide.md):
// | `name` | type | `label`, `label` | meaning |
func readmeMetrics(t *testing.T) []documentedMetric {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "docs", "operator-guide.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `(hwdra_[a-z_]+)` \\| (counter|gauge|histogram) \\| ([^|]*) \\|")
	label := regexp.MustCompile("`([a-z_]+)`")
	var out []documentedMetric
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			in = strings.TrimLeft(line, "#") == " Metrics"
			continue
		}
		if m := row.FindStringSubmatch(line); in && m != nil {
			d := documentedMetric{name: m[1], kind: m[2]}
			for _, l := range label.FindAllStringSubmatch(m[3], -1) {
				d.labels = append(d.labels, l[1])
			}
			sort.Strings(d.labels)
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		t.Fatal("no metrics table under ## Metrics in docs/operator-guide.md")
	}
	return out
}

// TestMetricsAsDocumented scrapes a working agent (a GPU and a NIC claim
// prepared, a pod's VF moved in and out through NRI, unprepared) and
// checks that every metric the operator guide documents is there with its type
// and exactly its labels, and that every hwdra_ metric served is
// documented.
func TestMetricsAsDocumented(t *testing.T) {
	docs := readmeMetrics(t)
	r := startNRIRig(t, "gpus: [{model: h100-80gb, count: 1, mig: true}]\nnics: [{model: cx7, count: 1, vfs: 4}]\n")
	ctx := context.Background()

	// A MIG claim through the kubelet's API.
	gpu := r.a.allocated(r.a.slices(device.GPUDriver, nil), "mig", migRequest("1g.10gb"))
	gpuDRA := drapb.NewDRAPluginClient(r.a.dial(r.a.socket(device.GPUDriver)))
	pb := &drapb.Claim{Namespace: gpu.Namespace, Name: gpu.Name, Uid: string(gpu.UID)}
	if resp, err := gpuDRA.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{pb}}); err != nil || resp.Claims[string(gpu.UID)].Error != "" {
		t.Fatalf("prepare %s: %v %+v", gpu.Name, err, resp)
	}
	// A VF share moved into a pod and back.
	sb := r.pod("a")
	nic := r.claim("share", "net", sb.Uid, "")
	r.prepare(nic)
	if err := r.run(sb); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(sb); err != nil {
		t.Fatal(err)
	}
	r.unprepare(nic)
	if resp, err := gpuDRA.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{pb}}); err != nil || resp.Claims[string(gpu.UID)].Error != "" {
		t.Fatalf("unprepare %s: %v %+v", gpu.Name, err, resp)
	}

	resp, err := http.Get("http://" + r.a.opts.MetricsAddress + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, d := range docs {
		documented[d.name] = true
		t.Run(d.name, func(t *testing.T) {
			mf, ok := families[d.name]
			if !ok || len(mf.GetMetric()) == 0 {
				t.Fatalf("not served (or no series)")
			}
			if got := strings.ToLower(mf.GetType().String()); got != d.kind {
				t.Errorf("type %s, documented %s", got, d.kind)
			}
			for _, m := range mf.GetMetric() {
				if got := labelNames(m); !slices.Equal(got, d.labels) {
					t.Errorf("series with labels %v, documented %v", got, d.labels)
				}
			}
		})
	}
	for name := range families {
		if strings.HasPrefix(name, "hwdra_") && !documented[name] {
			t.Errorf("%s is served but not in the operator guide's metrics table", name)
		}
	}
	// What the work above must have counted, by its labels.
	for _, sample := range []string{
		`hwdra_claim_operation_duration_seconds_count{driver="gpu.hwdra.io",kind="mig",operation="prepare",result="success"}`,
		`hwdra_claim_operation_duration_seconds_count{driver="sriov.hwdra.io",kind="vf-share",operation="unprepare",result="success"}`,
		`hwdra_nri_hook_duration_seconds_count{hook="RunPodSandbox",result="success"}`,
		`hwdra_nri_hook_duration_seconds_count{hook="StopPodSandbox",result="success"}`,
		`hwdra_published_devices{driver="sriov.hwdra.io",kind="vf-share"}`,
		`hwdra_device_health_state{device="gpu-0000-1b-00-0",driver="gpu.hwdra.io",pool="worker-1",state="Healthy"}`,
	} {
		if got := r.a.metric(sample); got == "" || got == "0" {
			t.Errorf("%s = %q, want a count", sample, got)
		}
	}
}

func labelNames(m *dto.Metric) []string {
	var out []string
	for _, l := range m.GetLabel() {
		out = append(out, l.GetName())
	}
	sort.Strings(out)
	return out
}
