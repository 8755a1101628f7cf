package gpu

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// benchPrepareUnprepare prepares and unprepares one claim through the
// plugin per iteration, checkpoint writes (fsync of file and directory)
// and CDI spec included, on an 8-GPU mock node with the node-wide driver
// spec present.
func benchPrepareUnprepare(b *testing.B, profile string, req request) {
	e := newEnv(b, profile, true)
	c := e.claim(req)
	ctx := klog.NewContext(context.Background(), logr.Discard())
	claims := []*resourceapi.ResourceClaim{c}
	refs := []kubeletplugin.NamespacedObject{{UID: c.UID}}
	before := e.hwState()
	var prep, unprep time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		res, err := e.plugin.PrepareResourceClaims(ctx, claims)
		prep += time.Since(start)
		if err == nil {
			err = res[c.UID].Err
		}
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		unres, err := e.plugin.UnprepareResourceClaims(ctx, refs)
		unprep += time.Since(start)
		if err == nil {
			err = unres[c.UID]
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(prep.Nanoseconds())/float64(b.N), "prepare-ns/op")
	b.ReportMetric(float64(unprep.Nanoseconds())/float64(b.N), "unprepare-ns/op")
	if after := e.hwState(); after != before {
		b.Fatalf("hardware after the benchmark:\n%s\nwas\n%s", after, before)
	}
}

func BenchmarkPrepareUnprepareFullGPU(b *testing.B) {
	benchPrepareUnprepare(b, "gpus: [{model: h100-80gb, count: 8}]", request{name: "gpu", cel: `profile == "full"`})
}

// A dynamic MIG partition on GPUs in MIG mode: GPU and compute instance
// created and destroyed each time.
func BenchmarkPrepareUnprepareMIG(b *testing.B) {
	benchPrepareUnprepare(b, "gpus: [{model: h100-80gb, count: 8, mig: true}]", request{name: "mig", cel: `profile == "1g.10gb"`})
}
