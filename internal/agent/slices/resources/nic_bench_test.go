// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"syscall"
	"testing"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
)

// BenchmarkNICDiscoveryAndSlices: what the agent does on every resync of a
// node with 4 PFs x 64 VFs in exclusive mode: read sysfs, resolve the
// configuration, build 256 devices in two slices. Target: under 20 ms.
// "mock" answers routes and eswitch mode as the mock node does; "netlink"
// asks the kernel of this machine, as on a real node.
func BenchmarkNICDiscoveryAndSlices(b *testing.B) {
	h := mocktest.Open(b, "nics: [{model: cx7, count: 4, vfs: 64}]")
	cfg, err := config.Parse([]byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\nnics:\n- mode: exclusive\n"))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		opts sriov.Options
	}{
		{"mock", sriov.Options{SysfsRoot: h.Sysfs, Routes: h.NICs(), Eswitch: h.NICs()}},
		{"netlink", sriov.Options{SysfsRoot: h.Sysfs}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			start := cpuTime()
			for b.Loop() {
				pfs, err := sriov.Discover(bc.opts)
				if err != nil {
					b.Fatal(err)
				}
				offers, _ := cfg.Resolve(pfs)
				res, skips := NIC(testNode, offers, device.AllFeatures)
				if sl := res.Pools[testNode].Slices; len(skips) != 0 || len(sl) != 2 || len(sl[0].Devices)+len(sl[1].Devices) != 256 {
					b.Fatalf("%d slices, skips %v", len(sl), skips)
				}
			}
			// CPU time (process, user+system) per op: wall time on a shared
			// machine depends on whatever else runs.
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
		})
	}
}

func cpuTime() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
