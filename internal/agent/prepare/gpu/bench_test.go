// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/backend/driverlibs"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// benchPrepareUnprepare prepares and unprepares one claim through the
// plugin per iteration, checkpoint writes (fsync of file and directory)
// and CDI spec included, on an 8-GPU mock node with the node-wide driver
// spec present; claims of held are prepared before and stay.
func benchPrepareUnprepare(b *testing.B, profile string, req request, held ...request) {
	benchPrepareUnprepareOn(b, newEnv(b, profile, true), req, held...)
}

// benchPrepareUnprepareOn is benchPrepareUnprepare on an env.
func benchPrepareUnprepareOn(b *testing.B, e *env, req request, held ...request) {
	before := e.hwState()
	var kept []*resourceapi.ResourceClaim
	for _, h := range held {
		c := e.claim(h)
		e.mustPrepare(c)
		kept = append(kept, c)
	}
	c := e.claim(req)
	if len(kept) > 0 {
		// The claim lands where the held ones are (a later share of
		// their GPU).
		if got, want := c.Status.Allocation.Devices.Results[0].Device, kept[0].Status.Allocation.Devices.Results[0].Device; got != want {
			b.Fatalf("the claim got %s, the held one %s", got, want)
		}
	}
	ctx := klog.NewContext(context.Background(), logr.Discard())
	// As the agent runs it: each prepare queues the claim's status, which
	// a writer applies in the background through client-go, over HTTP, to
	// an API server (one in the test process that takes each apply: the
	// agent's side of the write is what competes with prepare here).
	api, applies := statusServer(b, c)
	status := metadata.NewStatusWriter(api, DriverName, nil)
	statusCtx, stopStatus := context.WithCancel(ctx)
	defer stopStatus()
	go status.Run(statusCtx)
	e.plugin.ReportTo(benchReporter{status})
	claims := []*resourceapi.ResourceClaim{c}
	refs := []kubeletplugin.NamespacedObject{{UID: c.UID}}
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
	waitfor.True(b, "claim status written", 10*time.Second, func() bool { return status.Pending() == 0 })
	if n := applies.Load(); n < 1 {
		b.Fatalf("%d status applies", n)
	}
	b.ReportMetric(float64(prep.Nanoseconds())/float64(b.N), "prepare-ns/op")
	b.ReportMetric(float64(unprep.Nanoseconds())/float64(b.N), "unprepare-ns/op")
	for _, k := range kept {
		e.unprepare(k)
	}
	if after := e.hwState(); after != before {
		b.Fatalf("hardware after the benchmark:\n%s\nwas\n%s", after, before)
	}
}

// statusServer is an API server for claim status applies: it takes each
// one (a server-side apply of the claim's status) and answers with the
// claim, as the API server does; applies counts them.
func statusServer(b *testing.B, c *resourceapi.ResourceClaim) (kubernetes.Interface, *atomic.Int64) {
	var applies atomic.Int64
	answer, err := json.Marshal(c)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPatch || r.Header.Get("Content-Type") != string(types.ApplyPatchType) || !strings.HasSuffix(r.URL.Path, "/"+c.Name+"/status") {
			http.Error(w, "not a claim status apply: "+r.Method+" "+r.URL.Path, http.StatusBadRequest)
			return
		}
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		applies.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}))
	b.Cleanup(srv.Close)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, QPS: 50, Burst: 100})
	if err != nil {
		b.Fatal(err)
	}
	return client, &applies
}

// benchReporter queues a prepared claim's status as the agent does
// (agent.gpuStatusReporter).
type benchReporter struct{ w *metadata.StatusWriter }

func (r benchReporter) Prepared(claim *resourceapi.ResourceClaim, c prepare.Claim[Record]) {
	r.w.Set(metadata.ClaimStatus{Claim: metadata.ClaimRef{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name},
		Devices: Statuses(c), Time: metav1.Now()})
}

func BenchmarkPrepareUnprepareFullGPU(b *testing.B) {
	benchPrepareUnprepare(b, "gpus: [{model: h100-80gb, count: 8}]", request{name: "gpu", cel: `profile == "full"`})
}

// A whole GPU whose container gets the driver's files generated from the
// driver root (no toolkit spec): generated once, at the first prepare,
// then only the driver version asked of NVML and the toolkit's folders
// listed per prepare.
func BenchmarkPrepareUnprepareFullGPUGeneratedFiles(b *testing.B) {
	e := newEnv(b, "gpus: [{model: h100-80gb, count: 8}]", false)
	e.driver.files = driverlibs.New(driverlibs.Options{Root: e.hw.DriverRoot(), DevRoot: e.hw.Dir(), NVML: e.nvml.Library(),
		SpecDirs: []string{filepath.Join(e.dir, "etc-cdi")}, HookPath: "/var/lib/hwdra/bin/nvidia-cdi-hook"})
	benchPrepareUnprepareOn(b, e, request{name: "gpu", cel: `profile == "full"`})
}

// A dynamic MIG partition on GPUs in MIG mode: GPU and compute instance
// created and destroyed each time.
func BenchmarkPrepareUnprepareMIG(b *testing.B) {
	benchPrepareUnprepare(b, "gpus: [{model: h100-80gb, count: 8, mig: true}]", request{name: "mig", cel: `profile == "1g.10gb"`})
}

// The first share of a GPU: its MPS control daemon (the mock's stand-in,
// a process started from the driver root) started, told its defaults,
// and stopped again each time; the GPU's compute mode set and restored.
func BenchmarkPrepareUnprepareFirstShare(b *testing.B) {
	benchPrepareUnprepare(b, "gpus: [{model: h100-80gb, count: 8}]", shareOf("s", "10Gi", "40"))
}

// A later share of a GPU whose daemon runs for another share: checked
// through its control pipe, nothing started.
func BenchmarkPrepareUnprepareLaterShare(b *testing.B) {
	benchPrepareUnprepare(b, "gpus: [{model: h100-80gb, count: 8}]", shareOf("s", "10Gi", "40"), shareOf("s", "20Gi", "40"))
}

// A whole GPU under MPS for one claim: its own daemon each time.
func BenchmarkPrepareUnprepareMPSClaim(b *testing.B) {
	benchPrepareUnprepare(b, "gpus: [{model: h100-80gb, count: 8}]", request{name: "gpu", cel: `profile == "full"`, config: sharingConfig(`{"strategy": "MPS"}`)})
}

// BenchmarkQueueClaimStatus: what a prepare's path gains from claim
// status, for a MIG claim and a share: its entries built from the
// checkpoint (Statuses) and queued (StatusWriter.Set); the write itself
// is the writer's goroutine's.
func BenchmarkQueueClaimStatus(b *testing.B) {
	for _, tc := range []struct {
		name, profile string
		req           request
	}{
		{"MIG", "gpus: [{model: h100-80gb, count: 1, mig: true}]", request{name: "mig", cel: `profile == "1g.10gb"`}},
		{"share", "gpus: [{model: h100-80gb, count: 1}]", shareOf("s", "10Gi", "40")},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e := newEnv(b, tc.profile, true)
			c := e.claim(tc.req)
			e.mustPrepare(c)
			defer e.unprepare(c)
			entry := e.plugin.Claims()[c.UID]
			r := benchReporter{metadata.NewStatusWriter(nil, DriverName, nil)} // not run: Set alone
			b.ReportAllocs()
			for b.Loop() {
				r.Prepared(c, entry)
			}
		})
	}
}
