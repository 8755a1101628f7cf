// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"bufio"
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/mock/fault"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

// BenchmarkAgentRSSAfterPublishing starts the agent on a mock DGX H200 and
// reports the process's resident memory once every slice is published
// (target: under 60 MiB). The process also holds the test binary and the
// fake API server's copy of every slice, so the figure is an upper bound.
func BenchmarkAgentRSSAfterPublishing(b *testing.B) {
	a := startAgent(b, "mock:dgx-h200")
	a.slices(device.GPUDriver, nil)
	debug.FreeOSMemory()
	rss := rssKiB(b)
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	a.stop()
	for b.Loop() {
	}
	b.ReportMetric(float64(rss)/1024, "RSS-MiB")
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
}

func rssKiB(b testing.TB) int {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kib, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			if err != nil {
				b.Fatal(err)
			}
			return kib
		}
	}
	b.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// BenchmarkInjectedFaultToHealthReport: an XID injected into a running
// agent's mock DGX H100 (through its directory, as `hwdra mock inject`
// does), and its recovery, until the kubelet's health stream reports the
// GPU Unhealthy (Healthy again). Target: under 100 ms per report.
func BenchmarkInjectedFaultToHealthReport(b *testing.B) {
	dir := b.TempDir()
	b.Setenv(persist.DirEnv, dir)
	a := startAgent(b, "mock:dgx-h100")
	a.slices(device.GPUDriver, nil)
	w := a.watchHealth(device.GPUDriver)
	gpu := device.GPUName(benchGPU)
	is := func(want drahealthv1.HealthStatus) func(map[string]*drahealthv1.DeviceHealth) bool {
		return func(d map[string]*drahealthv1.DeviceHealth) bool { return d[gpu] != nil && d[gpu].Health == want }
	}
	w.wait("the first report", is(drahealthv1.HealthStatus_HEALTHY))
	var total time.Duration
	var worst time.Duration
	reports := 0
	for b.Loop() {
		for _, step := range []struct {
			fault fault.Fault
			want  drahealthv1.HealthStatus
		}{
			{fault.Fault{Kind: fault.XID, GPU: benchGPU, XID: 48}, drahealthv1.HealthStatus_UNHEALTHY},
			{fault.Fault{Kind: fault.Clear, GPU: benchGPU}, drahealthv1.HealthStatus_HEALTHY},
		} {
			start := time.Now()
			go func() { // the report may come before the injector hears back
				if err := fault.InjectDir(context.Background(), dir, step.fault); err != nil {
					b.Error(err)
				}
			}()
			w.wait("the report", is(step.want))
			d := time.Since(start)
			total += d
			worst = max(worst, d)
			reports++
		}
	}
	b.ReportMetric(float64(total.Microseconds())/float64(reports)/1000, "ms/report")
	b.ReportMetric(float64(worst.Microseconds())/1000, "worst-ms")
}

const benchGPU = "0000:1b:00.0"
