// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

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
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	resourceapi "k8s.io/api/resource/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/backend"
	hwmodel "github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/waitfor"
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
	label := regexp.MustCompile("`([A-Za-z_]+)`")
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

// hardwareOnly are documented metrics that mock hardware cannot serve:
// VF counters, which only a real PF's driver keeps (the mock's VFs are
// veth stand-ins). Served, they are checked like the others; their
// series are tested in internal/agent/podmetrics.
var hardwareOnly = map[string]bool{
	"hwdra_claim_vf_bytes_total": true, "hwdra_claim_vf_packets_total": true, "hwdra_claim_vf_dropped_packets_total": true,
}

// TestMetricsAsDocumented scrapes a working agent twice, while a GPU and
// a NIC claim are prepared for pods (a process of the GPU claim's pod on
// its MIG partition, the VF moved into its pod through NRI) and after the
// VF came back and its claim was unprepared, and checks that every metric
// the operator guide documents is there with its type and exactly its
// labels, and that every hwdra_ metric served is documented.
func TestMetricsAsDocumented(t *testing.T) {
	docs := readmeMetrics(t)
	profile := "gpus: [{model: h100-80gb, count: 2, mig: true}]\nnics: [{model: cx7, count: 1, vfs: 4}]\n"
	procRoot := t.TempDir()
	var hw *backend.Node // opened in the rig's host namespace, as the agent would
	r := startNRIRig(t, profile, func(o *Options) { hw = openNode(t, profile); o.node, o.procRoot = hw, procRoot })
	ctx := context.Background()

	// A MIG claim through the kubelet's API, for a pod whose process runs
	// on it.
	gpu := r.a.allocated(r.a.slices(device.GPUDriver, nil), "mig", migOn("1g.10gb", "0000:1b:00.0", 6))
	gpuDRA := drapb.NewDRAPluginClient(r.a.dial(r.a.socket(device.GPUDriver)))
	pb := &drapb.Claim{Namespace: gpu.Namespace, Name: gpu.Name, Uid: string(gpu.UID)}
	if resp, err := gpuDRA.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{pb}}); err != nil || resp.Claims[string(gpu.UID)].Error != "" {
		t.Fatalf("prepare %s: %v %+v", gpu.Name, err, resp)
	}
	id := strings.Repeat("c", 64)
	pod := podWithClaim(t, r.a, "trainer", gpu.Name, id)
	fakeProcess(t, procRoot, 4001, pod, id)
	bus := "0000:1b:00.0"
	instances, err := hw.GPU().GPUInstances(bus)
	if err != nil || len(instances) != 1 {
		t.Fatalf("GPU instances: %+v %v", instances, err)
	}
	if err := hw.Mock().SetGPUProcesses(bus, []hwmodel.GPUProcess{{PID: 4001, UsedMemory: ptr.To(uint64(1 << 30)), GPUInstance: ptr.To(instances[0].ID)}}); err != nil {
		t.Fatal(err)
	}
	// A GPU share on the other GPU, with a process of no pod beside it.
	shareReq := resourceapi.DeviceRequest{Name: "share", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "share.gpu.hwdra.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["resource.kubernetes.io"].pciBusID == "0000:43:00.0"`}}}}}
	share := r.a.allocated(r.a.slices(device.GPUDriver, nil), "gpushare", shareReq)
	prepareClaims(t, r.a, device.GPUDriver, share)
	podWithClaim(t, r.a, "server", share.Name, strings.Repeat("d", 64))
	other := share.Status.Allocation.Devices.Results[0].Device
	fakeProcess(t, procRoot, 4002, nil, "")
	if err := hw.Mock().SetGPUProcesses("0000:43:00.0", []hwmodel.GPUProcess{{PID: 4002, UsedMemory: ptr.To(uint64(1 << 20))}}); err != nil {
		t.Fatal(err)
	}
	t.Logf("share on %s", other)
	// A VF share moved into a pod and back.
	sb := r.pod("a")
	nic := r.claim("share", "net", sb.Uid, "")
	r.prepare(nic)
	if err := r.run(sb); err != nil {
		t.Fatal(err)
	}
	waitfor.True(t, "the pod's GPU memory series", 30*time.Second, func() bool {
		return strings.Contains(r.a.scrape(), `hwdra_pod_gpu_memory_used_bytes{`)
	})

	families := scrapeFamilies(t, r.a)
	if err := r.stop(sb); err != nil {
		t.Fatal(err)
	}
	r.unprepare(nic)
	if resp, err := gpuDRA.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{pb}}); err != nil || resp.Claims[string(gpu.UID)].Error != "" {
		t.Fatalf("unprepare %s: %v %+v", gpu.Name, err, resp)
	}
	unprepareClaims(t, r.a, device.GPUDriver, share)
	for name, mf := range scrapeFamilies(t, r.a) {
		if have, ok := families[name]; ok {
			have.Metric = append(have.Metric, mf.Metric...)
		} else {
			families[name] = mf
		}
	}

	documented := map[string]bool{}
	for _, d := range docs {
		documented[d.name] = true
		t.Run(d.name, func(t *testing.T) {
			mf, ok := families[d.name]
			if (!ok || len(mf.GetMetric()) == 0) && hardwareOnly[d.name] {
				t.Skip("served on real hardware only")
			}
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

// scrapeFamilies is one scrape of the agent, parsed.
func scrapeFamilies(t *testing.T, a *testAgent) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + a.opts.MetricsAddress + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return families
}

func labelNames(m *dto.Metric) []string {
	var out []string
	for _, l := range m.GetLabel() {
		out = append(out, l.GetName())
	}
	sort.Strings(out)
	return out
}
