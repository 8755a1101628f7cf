package agent

import (
	"bufio"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	hwslices "github.com/hwdra/hwdra/slices"
)

// BenchmarkAgentRSSAfterPublishing starts the agent on a mock DGX H200 and
// reports the process's resident memory once every slice is published
// (target: under 60 MiB). The process also holds the test binary and the
// fake API server's copy of every slice, so the figure is an upper bound.
func BenchmarkAgentRSSAfterPublishing(b *testing.B) {
	a := startAgent(b, "mock:dgx-h200")
	a.slices(hwslices.GPUDriver, nil)
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
