// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package police

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/hw"
)

const gib = 1 << 30

func gb(n uint64) *uint64 { v := n * gib; return &v }

// proc builds an observed process: pod "" is none.
func obs(pid uint32, pod string, mps bool, mem *uint64, uses ...int) observed {
	o := observed{GPUProcess: hw.GPUProcess{PID: pid, UsedMemory: mem, MPS: mps}, uses: uses}
	if pod != "" {
		o.pod = &podRef{Namespace: "ns", Name: pod}
		o.container = "app"
	}
	return o
}

func withLimits(o observed, memGiB uint64, threads float64) observed {
	l := startLimits{memory: gb(memGiB), threads: &threads}
	o.limits = &l
	return o
}

// shareClaims: two policed shares (a: 20 GiB 40%, b: 10 GiB 30%), a MIG
// partition's claim and a dedicated share (d: 10 GiB 20%) on one GPU.
var shareClaims = []Claim{
	{Namespace: "ns", Name: "a", GPU: "g", Share: &Share{Memory: 20 * gib, Compute: 40}},
	{Namespace: "ns", Name: "b", GPU: "g", Share: &Share{Memory: 10 * gib, Compute: 30}},
	{Namespace: "ns", Name: "mig", GPU: "g"},
	{Namespace: "ns", Name: "d", GPU: "g", Share: &Share{Memory: 10 * gib, Compute: 20, Dedicated: true}},
}

func summary(procs []observed, fs []finding) []string {
	var out []string
	for _, f := range fs {
		out = append(out, fmt.Sprintf("%d %s stop=%v", procs[f.proc].PID, f.reason, f.stop))
	}
	slices.Sort(out)
	return out
}

// TestDecide is the decision table: which process is acted on, for what,
// and never a process of another claim.
func TestDecide(t *testing.T) {
	server := obs(1, "", false, gb(1))
	server.server = true
	for _, tc := range []struct {
		name  string
		procs []observed
		stop  bool
		want  []string
	}{
		{"within their shares", []observed{
			server,
			withLimits(obs(10, "pa", true, gb(8), 0), 20, 40),
			withLimits(obs(11, "pa", true, gb(11), 0), 20, 40),
			withLimits(obs(20, "pb", true, gb(9), 1), 10, 30),
			obs(30, "pm", false, gb(30), 2),
		}, true, nil},
		{"a share's processes over its memory: the largest goes, the neighbour's stay", []observed{
			withLimits(obs(10, "pa", true, gb(8), 0), 20, 40),
			withLimits(obs(11, "pa", true, gb(16), 0), 20, 40),
			withLimits(obs(20, "pb", true, gb(10), 1), 10, 30),
		}, true, []string{"11 GPUShareMemoryOverrun stop=true"}},
		{"far over: as many as it takes, largest first", []observed{
			withLimits(obs(10, "pa", true, gb(12), 0), 20, 40),
			withLimits(obs(11, "pa", true, gb(16), 0), 20, 40),
			withLimits(obs(12, "pa", true, gb(14), 0), 20, 40),
		}, true, []string{"11 GPUShareMemoryOverrun stop=true", "12 GPUShareMemoryOverrun stop=true"}},
		{"Report: the same findings, nothing stopped", []observed{
			withLimits(obs(10, "pa", true, gb(8), 0), 20, 40),
			withLimits(obs(11, "pa", true, gb(16), 0), 20, 40),
		}, false, []string{"11 GPUShareMemoryOverrun stop=false"}},
		{"started with limits above its share, or none", []observed{
			withLimits(obs(10, "pa", true, gb(1), 0), 100, 40),
			withLimits(obs(11, "pa", true, gb(1), 0), 20, 100),
			func() observed { o := obs(12, "pa", true, gb(1), 0); o.limits = &startLimits{}; return o }(),
			obs(13, "pa", true, gb(1), 0), // environment unreadable: memory alone
		}, true, []string{"10 GPUShareLimitsRaised stop=true", "11 GPUShareLimitsRaised stop=true", "12 GPUShareLimitsRaised stop=true"}},
		{"a stopped process's memory no longer counts against its share", []observed{
			withLimits(obs(10, "pa", true, gb(12), 0), 20, 40),
			withLimits(obs(11, "pa", true, gb(14), 0), 100, 100),
		}, true, []string{"11 GPUShareLimitsRaised stop=true"}},
		{"a dedicated share's daemon holds its limits: its environment is not judged, its memory is", []observed{
			func() observed { o := obs(40, "pd", true, gb(2), 3); o.limits = &startLimits{}; return o }(),
			withLimits(obs(41, "pd", true, gb(9), 3), 100, 100),
		}, true, []string{"41 GPUShareMemoryOverrun stop=true"}},
		{"outside MPS", []observed{obs(20, "pb", false, gb(48), 1)}, true, []string{"20 GPUProcessOutsideMPS stop=true"}},
		{"a pod's process that uses no claim of the GPU", []observed{obs(50, "px", false, gb(1))}, true, []string{"50 GPUProcessWithoutClaim stop=true"}},
		{"outside Kubernetes: reported, never stopped", []observed{obs(60, "", false, gb(3))}, true, []string{"60 GPUProcessOutsideKubernetes stop=false"}},
		{"memory the driver does not tell is not judged", []observed{
			withLimits(obs(10, "pa", true, nil, 0), 20, 40),
			withLimits(obs(11, "pa", true, gb(19), 0), 20, 40),
		}, true, nil},
		{"one claim shared by two pods: their processes share its memory", []observed{
			withLimits(obs(10, "pa", true, gb(12), 0), 20, 40),
			withLimits(obs(70, "pa2", true, gb(11), 0), 20, 40),
		}, true, []string{"10 GPUShareMemoryOverrun stop=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := summary(tc.procs, decide("g", shareClaims, tc.procs, tc.stop))
			if !slices.Equal(got, tc.want) {
				t.Errorf("decide = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestDecideSays: what a finding says names the process, its pod and
// container, its claim and the figures.
func TestDecideSays(t *testing.T) {
	procs := []observed{
		withLimits(obs(10, "pa", true, gb(8), 0), 20, 40),
		withLimits(obs(11, "pa", true, gb(16), 0), 20, 40),
	}
	fs := decide("0000:1b:00.0", shareClaims, procs, true)
	if len(fs) != 1 {
		t.Fatalf("findings %+v", fs)
	}
	for _, want := range []string{"process 11", "pod ns/pa (container app)", "16.0 GiB", "GPU 0000:1b:00.0", "claim ns/a", "24.0 GiB together", "its share is 20.0 GiB"} {
		if !strings.Contains(fs[0].why, want) {
			t.Errorf("finding says %q, want %q in it", fs[0].why, want)
		}
	}
}
