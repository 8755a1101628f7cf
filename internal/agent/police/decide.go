// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package police

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/hw"
)

// Claim is a prepared claim's use of one GPU.
type Claim struct {
	Namespace, Name string
	// GPU is the GPU's PCI bus ID.
	GPU string
	// Share is set where the claim is a share of the GPU.
	Share *Share
}

// Share is what a GPU share was counted for.
type Share struct {
	Memory  uint64 // bytes
	Compute int    // percent of the GPU's multiprocessors
	// Dedicated: the share's own MPS daemon holds its clients to its
	// limits, whatever their environment says.
	Dedicated bool
}

// Reason is what a process on a GPU with shares did wrong; it is the
// reason of the Event on its pod and a label of the metric.
type Reason string

const (
	// MemoryOverrun: a share's processes together hold more GPU memory
	// than the share.
	MemoryOverrun Reason = "GPUShareMemoryOverrun"
	// LimitsRaised: an MPS client of a policed share started with a
	// memory limit or thread percentage above its share, or with none.
	LimitsRaised Reason = "GPUShareLimitsRaised"
	// OutsideMPS: a process of a share's container has a context of its
	// own on the GPU, outside MPS and every limit (compute mode Default).
	OutsideMPS Reason = "GPUProcessOutsideMPS"
	// NoClaim: a pod's process on the GPU whose container uses no claim
	// prepared on that GPU.
	NoClaim Reason = "GPUProcessWithoutClaim"
	// OutsideKubernetes: a process of no pod (a host service, an
	// operator's tool). Reported, never stopped.
	OutsideKubernetes Reason = "GPUProcessOutsideKubernetes"
)

// Reasons are every Reason, for the metric's series.
var Reasons = []Reason{MemoryOverrun, LimitsRaised, OutsideMPS, NoClaim, OutsideKubernetes}

// observed is one process on a GPU as the watcher learnt it.
type observed struct {
	hw.GPUProcess
	// pod is nil for a process outside any pod.
	pod *podRef
	// container is its container's name; "" where the pod's status does
	// not name it yet (uses then holds every claim of the pod).
	container string
	// uses are the claims of the GPU (indexes into its claims) the
	// container uses.
	uses []int
	// needsEnv: its limits decide (an MPS client of a policed share).
	needsEnv bool
	// limits are what its environment showed, at its worst; nil where it
	// was not read.
	limits *startLimits
	// server: the MPS server, outside any pod.
	server bool
}

type podRef struct {
	Namespace, Name string
	UID             types.UID
}

// finding is what to do about one process.
type finding struct {
	proc   int // index into the observed processes
	reason Reason
	// stop: the process is to be stopped; false: reported.
	stop bool
	// why says what the process did, with figures, for the Event and the
	// log.
	why string
}

// decide judges the processes on one GPU against the claims prepared on
// it: at most one finding per process. stop is gpus.shares.overuse: Stop;
// a process outside Kubernetes is never stopped.
func decide(gpu string, claims []Claim, procs []observed, stop bool) []finding {
	var out []finding
	judged := make([]bool, len(procs))
	add := func(i int, r Reason, stopIt bool, why string) {
		judged[i] = true
		out = append(out, finding{proc: i, reason: r, stop: stopIt, why: why})
	}
	for i, p := range procs {
		if p.server {
			continue
		}
		if p.pod == nil {
			add(i, OutsideKubernetes, false, fmt.Sprintf("process %d of no pod holds %s on GPU %s", p.PID, memory(p.UsedMemory), gpu))
			continue
		}
		if len(p.uses) == 0 {
			add(i, NoClaim, stop, fmt.Sprintf("process %d%s holds %s on GPU %s, but its container uses no claim prepared on that GPU", p.PID, of(p), memory(p.UsedMemory), gpu))
			continue
		}
		sh := shareOf(claims, p.uses)
		if sh == nil {
			continue // a whole GPU or a partition of its own: not a share's
		}
		if !p.MPS {
			add(i, OutsideMPS, stop, fmt.Sprintf("process %d%s of %s has a context of its own on GPU %s outside MPS, beyond every share's limits, and holds %s",
				p.PID, of(p), names(claims, p.uses), gpu, memory(p.UsedMemory)))
			continue
		}
		if why := raised(p, sh); why != "" && !sh.Dedicated {
			add(i, LimitsRaised, stop, fmt.Sprintf("process %d%s of %s has %s in its environment on GPU %s", p.PID, of(p), names(claims, p.uses), why, gpu))
		}
	}
	return append(out, overruns(gpu, claims, procs, judged, stop)...)
}

// overruns finds the shares whose processes hold more memory than the
// share: its largest processes are the ones to stop (as the kernel's OOM
// killer picks), until the rest fit. Processes are grouped by the set of
// shares their container uses (nearly always one), allowed their sum. A
// process already to be stopped no longer counts; one whose memory the
// driver does not tell is not judged on memory.
func overruns(gpu string, claims []Claim, procs []observed, judged []bool, stop bool) []finding {
	groups := map[string][]int{}
	for i, p := range procs {
		if p.server || p.pod == nil || p.UsedMemory == nil || shareOf(claims, p.uses) == nil {
			continue
		}
		key := fmt.Sprint(p.uses)
		groups[key] = append(groups[key], i)
	}
	var out []finding
	for _, key := range slices.Sorted(maps.Keys(groups)) {
		members := groups[key]
		uses := procs[members[0]].uses
		allowed := shareOf(claims, uses).Memory
		var total uint64
		var left []int
		for _, i := range members {
			if !judged[i] || !stop {
				total += *procs[i].UsedMemory
				left = append(left, i)
			}
		}
		if total <= allowed {
			continue
		}
		slices.SortStableFunc(left, func(a, b int) int {
			return cmp.Or(cmp.Compare(*procs[b].UsedMemory, *procs[a].UsedMemory), cmp.Compare(procs[a].PID, procs[b].PID))
		})
		held := total
		for _, i := range left {
			if held <= allowed {
				break
			}
			held -= *procs[i].UsedMemory
			if judged[i] {
				continue // already found out for something else
			}
			p := procs[i]
			out = append(out, finding{proc: i, reason: MemoryOverrun, stop: stop, why: fmt.Sprintf(
				"process %d%s holds %s on GPU %s; the processes of %s hold %s together, and %s %s",
				p.PID, of(p), memory(p.UsedMemory), gpu, names(claims, uses), bytesOf(total), shareWord(uses), bytesOf(allowed))})
		}
	}
	return out
}

// shareOf sums the shares among the claims a process uses (nil: none is a
// share). Dedicated only when every one is.
func shareOf(claims []Claim, uses []int) *Share {
	var sum *Share
	for _, i := range uses {
		s := claims[i].Share
		if s == nil {
			continue
		}
		if sum == nil {
			sum = &Share{Dedicated: true}
		}
		sum.Memory += s.Memory
		sum.Compute = min(sum.Compute+s.Compute, 100)
		sum.Dedicated = sum.Dedicated && s.Dedicated
	}
	return sum
}

// raised says how a client's environment exceeds its share ("" if it
// does not): no limit at all is above any share, and so is a limit not
// within the part of an environment the police reads (a process that
// hides its limits past the cap is taken at its word: none).
func raised(p observed, sh *Share) string {
	if p.limits == nil {
		return "" // not read (yet): judged on memory alone
	}
	l := p.limits
	missing := func(name, share string) string {
		if l.cut {
			return fmt.Sprintf("no %s in the first %s of its environment, which goes on beyond (taken as none; its share: %s)", name, bytesOf(uint64(l.read)), share)
		}
		return fmt.Sprintf("no %s (its share: %s)", name, share)
	}
	var why []string
	switch m := l.memory; {
	case m == nil:
		why = append(why, missing(memoryEnv, bytesOf(sh.Memory)))
	case *m > sh.Memory:
		why = append(why, fmt.Sprintf("%s %s (its share: %s)", memoryEnv, bytesOf(*m), bytesOf(sh.Memory)))
	}
	switch t := l.threads; {
	case t == nil:
		why = append(why, missing(threadsEnv, fmt.Sprintf("%d%%", sh.Compute)))
	case *t > float64(sh.Compute):
		why = append(why, fmt.Sprintf("%s %g%% (its share: %d%%)", threadsEnv, *t, sh.Compute))
	}
	return strings.Join(why, " and ")
}

func of(p observed) string {
	if p.pod == nil {
		return ""
	}
	if p.container == "" {
		return fmt.Sprintf(" of pod %s/%s", p.pod.Namespace, p.pod.Name)
	}
	return fmt.Sprintf(" of pod %s/%s (container %s)", p.pod.Namespace, p.pod.Name, p.container)
}

func names(claims []Claim, uses []int) string {
	var n []string
	for _, i := range uses {
		if claims[i].Share != nil {
			n = append(n, claims[i].Namespace+"/"+claims[i].Name)
		}
	}
	if len(n) == 1 {
		return "claim " + n[0]
	}
	return "claims " + strings.Join(n, ", ")
}

func shareWord(uses []int) string {
	if len(uses) == 1 {
		return "its share is"
	}
	return "their shares are"
}

func memory(b *uint64) string {
	if b == nil {
		return "GPU memory the driver does not tell"
	}
	return bytesOf(*b)
}

// bytesOf is a size as operators read it: "20.0 GiB".
func bytesOf(b uint64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%d bytes", b)
}
