// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podmetrics

import (
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// BenchmarkScrape is one scrape of the per-pod series on a node with 8
// GPUs and 100 processes: 96 share pods (12 per GPU, each with a claim
// and a process), 4 processes outside pods, every series gathered and
// written as the exposition Prometheus reads. NVML's listings answer at
// once here (on hardware add theirs: 8 per scrape where the listings are
// older than MaxAge, none within it); each process's cgroup file is a
// real file read.
func BenchmarkScrape(b *testing.B) {
	for _, cached := range []bool{false, true} {
		b.Run(fmt.Sprintf("listingsCached=%v", cached), func(b *testing.B) {
			n := newNode(b)
			pid := uint32(1000)
			for g := range 8 {
				bus := fmt.Sprintf("0000:%02x:00.0", 0x10+g)
				uuid := fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", g)
				for s := range 12 {
					claim := fmt.Sprintf("c-%d-%d", g, s)
					d := shareDevice("ns", claim, 4<<30, 8)
					d.GPU, d.UUID, d.Name = bus, uuid, device.ShareName(bus)
					n.devices = append(n.devices, d)
					p := n.pod("ns", "pod-"+claim, claim)
					n.run(bus, p, pid, 1<<30, nil)
					pid++
				}
				if g < 4 {
					n.run(bus, nil, pid, 256<<20, nil)
					pid++
				}
			}
			maxAge := time.Nanosecond
			if cached {
				maxAge = time.Hour
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(n.collector(Options{MaxAge: maxAge}))
			series := 0
			b.ReportAllocs()
			b.ResetTimer()
			before := cpuTime(b)
			for b.Loop() {
				mfs, err := reg.Gather()
				if err != nil {
					b.Fatal(err)
				}
				enc := expfmt.NewEncoder(io.Discard, expfmt.NewFormat(expfmt.TypeTextPlain))
				series = 0
				for _, mf := range mfs {
					series += len(mf.GetMetric())
					if err := enc.Encode(mf); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			// CPU time beside wall time: on a shared machine the wall time
			// of a scrape is mostly waiting for a core.
			b.ReportMetric(float64((cpuTime(b)-before).Nanoseconds())/float64(b.N), "cpu-ns/op")
			// 96 info, 96 memory, 192 limits, 8 up, 4 unclaimed.
			if series != 396 {
				b.Fatalf("%d series, want 396", series)
			}
			b.ReportMetric(float64(series), "series")
		})
	}
}

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
