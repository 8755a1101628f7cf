// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package police

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

// BenchmarkCheck is one round of the police over one GPU with shares,
// with the processes a busy shared GPU has (all within their shares, the
// usual case): per process a pidfd, four small /proc files, the mapping
// and the decision. NVML's two listings are not in it (the fake answers
// at once): on real hardware add theirs. The cost per GPU per second is
// this times the rounds per second (1 at the default interval).
func BenchmarkCheck(b *testing.B) {
	for _, n := range []int{4, 16, 48} {
		b.Run(fmt.Sprintf("processes=%d", n), func(b *testing.B) {
			nd := newNode(b)
			for i := range n / 2 {
				nd.claims = append(nd.claims, Claim{Namespace: "ns", Name: fmt.Sprint("c", i), GPU: "g", Share: &Share{Memory: 4 * gib, Compute: 5}})
			}
			for i := range n {
				nd.run(nd.pod(fmt.Sprint("p", i), fmt.Sprint("c", i/2)), true, 1, shareEnv(4096, 5)...)
			}
			w := New(Options{Claims: nd, Processes: nd, Pods: nd, Stop: true, ProcRoot: nd.procRoot, Interval: time.Hour})
			ctx := klog.NewContext(context.Background(), klog.Background().V(9))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				w.Check(ctx)
			}
			b.StopTimer()
			if len(nd.found) != 0 {
				b.Fatalf("found %q among processes within their shares", nd.found)
			}
		})
	}
}

// BenchmarkReadFatEnvironment reads one process's 6 MB environment
// (/proc/<pid>/environ, through the scanner's one buffer), as a round
// does up to its cap (envBytesPerRound): the cost of a round on a
// GPU whose processes have fat environments is the cap over this speed.
func BenchmarkReadFatEnvironment(b *testing.B) {
	bigStack(b)
	n := newNode(b)
	cmd := n.run(n.pod("p", "a"), true, 1, fatEnv(shareEnv(4096, 5)...)...)
	p, err := inspect(n.procRoot, uint32(cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	defer p.close()
	var s envScanner
	b.ReportAllocs()
	var read int64
	for b.Loop() {
		l, err := p.environment(&s, envBytesPerProcess)
		if err != nil || l.threads == nil {
			b.Fatalf("%+v %v", l, err)
		}
		read += l.read
	}
	b.SetBytes(read / int64(b.N))
}
