// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"context"
	"os"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// BenchmarkPrepareUnprepareVFShare: one claim with a 10G share of a CX7,
// prepared and unprepared through prepare.Plugin: plan, VF reservation,
// GetVF/SetVF on the mock, CDI spec (the VF has RDMA), metadata, and every
// checkpoint and ledger write with its fsyncs. HWDRA_BENCH_DIR puts the
// state and CDI dirs elsewhere (/dev/shm: the cost without the disk).
func BenchmarkPrepareUnprepareVFShare(b *testing.B) {
	e := newEnv(b, cx7Node, "")
	if dir := os.Getenv("HWDRA_BENCH_DIR"); dir != "" {
		d, err := os.MkdirTemp(dir, "hwdra-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(d) })
		e.dir = d
		e.start()
	}
	c := e.allocate(newClaim(`, "vlan": 10, "mtu": 9000`, share("nic", "10G")))
	ctx := context.Background()
	claims := []*resourceapi.ResourceClaim{c}
	refs := []kubeletplugin.NamespacedObject{{UID: c.UID}}
	var prep, unprep time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		res, err := e.plugin.PrepareResourceClaims(ctx, claims)
		prep += time.Since(start)
		if err != nil || res[c.UID].Err != nil {
			b.Fatal(err, res[c.UID].Err)
		}
		start = time.Now()
		un, err := e.plugin.UnprepareResourceClaims(ctx, refs)
		unprep += time.Since(start)
		if err != nil || un[c.UID] != nil {
			b.Fatal(err, un[c.UID])
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(prep.Nanoseconds())/float64(b.N), "prepare-ns/op")
	b.ReportMetric(float64(unprep.Nanoseconds())/float64(b.N), "unprepare-ns/op")
	e.checkPristine()
}
