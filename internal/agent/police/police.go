// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package police

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/hw"
)

// Claims are the claims prepared on the node (the GPU driver's
// checkpoint), each once per GPU it uses.
type Claims interface {
	GPUClaims() []Claim
}

// Processes lists the processes with a context on a GPU (nvml.Backend).
type Processes interface {
	GPUProcesses(busID string) ([]hw.GPUProcess, error)
}

// Pods finds a pod of the node by UID (the agent's pod informer); the pod
// carries its claims, its containers' claims and its containers' IDs.
type Pods interface {
	PodByUID(uid types.UID) (*corev1.Pod, bool)
}

// What the watcher did to a process it found at fault.
const (
	ActionStopped    = "stopped"
	ActionReported   = "reported"
	ActionStopFailed = "stop-failed"
)

// Observer counts what the watcher does (the agent's metrics).
type Observer interface {
	// Found: a process was acted on (ActionStopped, ActionReported,
	// ActionStopFailed).
	Found(reason Reason, action string)
	// Checked: one round over gpus GPUs took d.
	Checked(gpus int, d time.Duration)
}

// Options configure a Watcher.
type Options struct {
	Claims    Claims
	Processes Processes
	Pods      Pods
	// Interval between rounds: how long a process can overrun before it is
	// caught.
	Interval time.Duration
	// Stop: gpus.shares.overuse Stop; false: Report.
	Stop bool
	// Events records the Events (nil: none); Node names the node, whose
	// object gets the Events of processes outside Kubernetes.
	Events events.EventRecorder
	Node   *corev1.ObjectReference
	// Observer may be nil.
	Observer Observer
	// ProcRoot is /proc, where a test does not say otherwise.
	ProcRoot string
}

// Watcher polices the GPUs with shares.
type Watcher struct {
	o Options
	// told are the findings already reported, by process and reason: a
	// process that goes on overrunning under Report is reported once.
	told map[toldKey]bool
	// listErr is each GPU's last listing error, logged when it changes
	// (an old driver refuses every round alike).
	listErr map[string]string
	// envs is what the environment reads of each process found, at its
	// worst (env.go); round counts the rounds, for the order of the reads.
	envs    map[procKey]*envSeen
	round   uint64
	scanner envScanner
}

// procKey is a process: a PID and start time.
type procKey struct {
	pid   uint32
	start uint64
}

type toldKey struct {
	procKey
	reason Reason
}

// envSeen is what the reads of one process's environment showed.
type envSeen struct {
	worst startLimits
	round uint64 // when it was last read
}

// New makes a Watcher.
func New(o Options) *Watcher {
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	return &Watcher{o: o, told: map[toldKey]bool{}, listErr: map[string]string{}, envs: map[procKey]*envSeen{}}
}

// Run checks every Interval until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.o.Interval)
	defer t.Stop()
	for {
		w.Check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// gpuRound is one GPU's processes in a round, each held by a pidfd.
type gpuRound struct {
	gpu    string
	claims []Claim
	procs  []observed
	held   []*proc
}

// Check makes one round over the GPUs that serve shares: each GPU's
// processes listed and confirmed (look), the environments the decision
// needs read within the round's cap (readEnvironments), then judged.
func (w *Watcher) Check(ctx context.Context) {
	began := time.Now()
	w.round++
	byGPU := map[string][]Claim{}
	var shared []string
	for _, c := range w.o.Claims.GPUClaims() {
		byGPU[c.GPU] = append(byGPU[c.GPU], c)
		if c.Share != nil && !slices.Contains(shared, c.GPU) {
			shared = append(shared, c.GPU)
		}
	}
	slices.Sort(shared)
	var rounds []gpuRound
	defer func() {
		for _, r := range rounds {
			for _, p := range r.held {
				p.close()
			}
		}
	}()
	for _, gpu := range shared {
		if r, ok := w.look(ctx, gpu, byGPU[gpu]); ok {
			rounds = append(rounds, r)
		}
	}
	live := w.readEnvironments(ctx, rounds)
	seen := map[toldKey]bool{}
	for _, r := range rounds {
		w.judge(ctx, r, seen)
	}
	for k := range w.told {
		if !seen[k] {
			delete(w.told, k) // gone, or no longer at fault
		}
	}
	for k := range w.envs {
		if !live[k] {
			delete(w.envs, k)
		}
	}
	if w.o.Observer != nil {
		w.o.Observer.Checked(len(shared), time.Since(began))
	}
}

// list is the GPU's processes by NVML, its error logged when it changes.
func (w *Watcher) list(ctx context.Context, gpu string) ([]hw.GPUProcess, bool) {
	logger := klog.FromContext(ctx)
	listed, err := w.o.Processes.GPUProcesses(gpu)
	if err != nil {
		if w.listErr[gpu] != err.Error() {
			w.listErr[gpu] = err.Error()
			logger.Error(err, "Listing the processes on a GPU with shares: its shares are not policed until the driver lists them (said again only if the error changes)", "gpu", gpu)
		}
		return nil, false
	}
	if w.listErr[gpu] != "" {
		delete(w.listErr, gpu)
		logger.Info("The processes on a GPU with shares are listed again: its shares are policed", "gpu", gpu)
	}
	return listed, true
}

// look lists the processes on a GPU, opens each with a pidfd and reads
// its /proc, then lists them again: only a process that the second
// listing names and that still lives after it is judged, with that
// listing's entry. A PID reused between NVML's listing and the pidfd
// (the listed process gone, another given its PID) is then left alone:
// the pidfd holds the other process, which the second listing does not
// name, or which started after the first listing began, so is not the
// process it listed. A PID is not reused while its process lives, so
// what the second listing says of it is that process's.
func (w *Watcher) look(ctx context.Context, gpu string, claims []Claim) (gpuRound, bool) {
	logger := klog.FromContext(ctx)
	r := gpuRound{gpu: gpu, claims: claims}
	before := bootTicks()
	listed, ok := w.list(ctx, gpu)
	if !ok {
		return r, false
	}
	var opened []*proc
	for _, lp := range listed {
		p, err := inspect(w.o.ProcRoot, lp.PID)
		switch {
		case errors.Is(err, errGone):
		case err != nil:
			logger.Error(err, "Reading a process on a GPU with shares: it is not judged", "gpu", gpu, "pid", lp.PID)
		case p.start > before:
			logger.V(2).Info("A process on a GPU with shares started after the driver listed its PID: not the process listed, not judged", "gpu", gpu, "pid", lp.PID)
			p.close()
		default:
			opened = append(opened, p)
		}
	}
	again, ok := w.list(ctx, gpu)
	if !ok {
		for _, p := range opened {
			p.close()
		}
		return r, false
	}
	for _, p := range opened {
		i := slices.IndexFunc(again, func(lp hw.GPUProcess) bool { return lp.PID == p.pid })
		if i < 0 || !p.alive() {
			p.close() // gone from the GPU, or reused
			continue
		}
		o, ok := w.observe(again[i], p, claims)
		if !ok {
			logger.V(2).Info("A process on a GPU with shares is in a pod the agent does not know yet: judged next round", "gpu", gpu, "pid", p.pid)
			p.close()
			continue
		}
		r.procs = append(r.procs, o)
		r.held = append(r.held, p)
	}
	return r, true
}

// judge acts on what decide finds among a GPU's processes.
func (w *Watcher) judge(ctx context.Context, r gpuRound, seen map[toldKey]bool) {
	for _, f := range decide(r.gpu, r.claims, r.procs, w.o.Stop) {
		p, h := r.procs[f.proc], r.held[f.proc]
		key := toldKey{procKey: procKey{pid: p.PID, start: h.start}, reason: f.reason}
		seen[key] = true
		if w.told[key] {
			continue
		}
		// A stop that failed is tried again next round.
		w.told[key] = w.act(ctx, f, p, h)
	}
}

// readEnvironments reads the environment of each process whose
// decision needs it (an MPS client of a policed share), those never read
// first, then those read longest ago, until the round has read
// envBytesPerRound; each process is then judged on its reads at their
// worst (startLimits.worsen): a process that rewrites its environment
// in place after a read keeps what that read found. A process not read
// yet is judged on memory alone this round. It returns the processes
// seen this round.
func (w *Watcher) readEnvironments(ctx context.Context, rounds []gpuRound) map[procKey]bool {
	type want struct {
		key  procKey
		p    *proc
		last uint64
	}
	live, queued := map[procKey]bool{}, map[procKey]bool{}
	var wants []want
	for _, r := range rounds {
		for i, o := range r.procs {
			key := procKey{pid: o.PID, start: r.held[i].start}
			live[key] = true
			if queued[key] || !o.needsEnv {
				continue
			}
			queued[key] = true
			var last uint64
			if e := w.envs[key]; e != nil {
				last = e.round
			}
			wants = append(wants, want{key: key, p: r.held[i], last: last})
		}
	}
	slices.SortFunc(wants, func(a, b want) int { return cmp.Or(cmp.Compare(a.last, b.last), cmp.Compare(a.key.pid, b.key.pid)) })
	var read int64
	unread := 0
	for _, x := range wants {
		if read >= envBytesPerRound {
			if w.envs[x.key] == nil {
				unread++
			}
			continue
		}
		l, err := x.p.environment(&w.scanner, envBytesPerProcess)
		read += l.read
		if err != nil {
			if !errors.Is(err, errGone) {
				klog.FromContext(ctx).V(2).Info("Reading a process's environment: judged on its earlier reads, or memory alone", "pid", x.key.pid, "err", err)
			}
			continue
		}
		e := w.envs[x.key]
		if e == nil {
			e = &envSeen{worst: l}
			w.envs[x.key] = e
		} else {
			e.worst.worsen(l)
		}
		e.round = w.round
	}
	if unread > 0 {
		klog.FromContext(ctx).V(2).Info("Environments left for later rounds: this round read its cap", "processes", unread, "bytes", read)
	}
	for _, r := range rounds {
		for i := range r.procs {
			o := &r.procs[i]
			if e := w.envs[procKey{pid: o.PID, start: r.held[i].start}]; o.needsEnv && e != nil {
				l := e.worst
				o.limits = &l
			}
		}
	}
	return live
}

// observe maps a listed process to its pod, container and the claims of
// the GPU it uses; ok is false for a pod the informer does not have (yet).
func (w *Watcher) observe(lp hw.GPUProcess, p *proc, claims []Claim) (observed, bool) {
	o := observed{GPUProcess: lp}
	uid, containerID := p.pod, p.container
	if !p.inPod {
		// The MPS server the agent's daemons start runs outside pods
		// (beside the agent's pod or in the agent's cgroup).
		o.server = p.comm == "nvidia-cuda-mps-server"
		return o, true
	}
	pod, ok := w.o.Pods.PodByUID(uid)
	if !ok {
		return o, false
	}
	o.pod = &podRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	var used []string
	o.container, used = containerClaims(pod, containerID)
	for i, c := range claims {
		if c.Namespace == pod.Namespace && slices.Contains(used, c.Name) {
			o.uses = append(o.uses, i)
		}
	}
	sh := shareOf(claims, o.uses)
	o.needsEnv = lp.MPS && sh != nil && !sh.Dedicated
	return o, true
}

// containerClaims names the container with that runtime ID and the
// ResourceClaims it uses; for a container the pod's status does not list
// yet, "" and every claim of the pod.
func containerClaims(pod *corev1.Pod, containerID string) (string, []string) {
	name := ""
	if containerID != "" {
		for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses, pod.Status.EphemeralContainerStatuses} {
			for _, s := range list {
				if _, id, _ := strings.Cut(s.ContainerID, "://"); id == containerID {
					name = s.Name
				}
			}
		}
	}
	claimName := map[string]string{}
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		if n, _, err := resourceclaim.Name(pod, pc); err == nil && n != nil {
			claimName[pc.Name] = *n
		}
	}
	var out []string
	if ext := pod.Status.ExtendedResourceClaimStatus; ext != nil {
		for _, m := range ext.RequestMappings {
			if name == "" || m.ContainerName == name {
				out = append(out, ext.ResourceClaimName)
				break
			}
		}
	}
	if name == "" {
		for _, n := range claimName {
			out = append(out, n)
		}
		return "", out
	}
	for _, c := range containers(pod) {
		if c.Name != name {
			continue
		}
		for _, rc := range c.Resources.Claims {
			if n, ok := claimName[rc.Name]; ok {
				out = append(out, n)
			}
		}
	}
	return name, out
}

func containers(pod *corev1.Pod) []corev1.Container {
	out := slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers)
	for _, e := range pod.Spec.EphemeralContainers {
		out = append(out, corev1.Container(e.EphemeralContainerCommon))
	}
	return out
}

// act stops or reports one process: the log, an Event on its pod (or the
// node, for a process of no pod) and the metric. It reports whether it
// is done with the finding (false: the stop failed).
func (w *Watcher) act(ctx context.Context, f finding, p observed, h *proc) bool {
	logger := klog.FromContext(ctx)
	action, verb := ActionReported, "reported (gpus.shares.overuse: Report)"
	if f.reason == OutsideKubernetes {
		verb = "reported; a process outside Kubernetes is never stopped"
	}
	if f.stop {
		action, verb = ActionStopped, "stopped (gpus.shares.overuse: Stop)"
		if err := h.kill(); err != nil {
			action, verb = ActionStopFailed, "could not be stopped: "+err.Error()
		}
	}
	note := f.why + ": " + verb
	logger.Info("Warning: "+note, "reason", f.reason, "pid", p.PID)
	if w.o.Observer != nil {
		w.o.Observer.Found(f.reason, action)
	}
	if w.o.Events == nil {
		return action != ActionStopFailed
	}
	eventAction := "Report"
	if f.stop {
		eventAction = "Stop"
	}
	if p.pod != nil {
		ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.pod.Namespace, Name: p.pod.Name, UID: p.pod.UID}
		w.o.Events.Eventf(ref, nil, corev1.EventTypeWarning, string(f.reason), eventAction, "%s", note)
	} else if w.o.Node != nil {
		w.o.Events.Eventf(w.o.Node, nil, corev1.EventTypeWarning, string(f.reason), eventAction, "%s", note)
	}
	return action != ActionStopFailed
}
