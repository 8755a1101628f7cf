package police

import (
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
}

type toldKey struct {
	pid    uint32
	start  uint64
	reason Reason
}

// New makes a Watcher.
func New(o Options) *Watcher {
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	return &Watcher{o: o, told: map[toldKey]bool{}, listErr: map[string]string{}}
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

// Check makes one round over the GPUs that serve shares.
func (w *Watcher) Check(ctx context.Context) {
	began := time.Now()
	byGPU := map[string][]Claim{}
	var shared []string
	for _, c := range w.o.Claims.GPUClaims() {
		byGPU[c.GPU] = append(byGPU[c.GPU], c)
		if c.Share != nil && !slices.Contains(shared, c.GPU) {
			shared = append(shared, c.GPU)
		}
	}
	slices.Sort(shared)
	seen := map[toldKey]bool{}
	for _, gpu := range shared {
		w.checkGPU(ctx, gpu, byGPU[gpu], seen)
	}
	for k := range w.told {
		if !seen[k] {
			delete(w.told, k) // gone, or no longer at fault
		}
	}
	if w.o.Observer != nil {
		w.o.Observer.Checked(len(shared), time.Since(began))
	}
}

func (w *Watcher) checkGPU(ctx context.Context, gpu string, claims []Claim, seen map[toldKey]bool) {
	logger := klog.FromContext(ctx)
	listed, err := w.o.Processes.GPUProcesses(gpu)
	if err != nil {
		if w.listErr[gpu] != err.Error() {
			w.listErr[gpu] = err.Error()
			logger.Error(err, "Listing the processes on a GPU with shares: its shares are not policed until the driver lists them (said again only if the error changes)", "gpu", gpu)
		}
		return
	}
	if w.listErr[gpu] != "" {
		delete(w.listErr, gpu)
		logger.Info("The processes on a GPU with shares are listed again: its shares are policed", "gpu", gpu)
	}
	var procs []observed
	var held []*proc
	defer func() {
		for _, p := range held {
			p.close()
		}
	}()
	for _, lp := range listed {
		p, err := inspect(w.o.ProcRoot, lp.PID)
		if errors.Is(err, errGone) {
			continue
		}
		if err != nil {
			logger.Error(err, "Reading a process on a GPU with shares: it is not judged", "gpu", gpu, "pid", lp.PID)
			continue
		}
		o, ok := w.observe(lp, p, claims)
		if !ok {
			logger.V(2).Info("A process on a GPU with shares is in a pod the agent does not know yet: judged next round", "gpu", gpu, "pid", lp.PID)
			p.close()
			continue
		}
		procs = append(procs, o)
		held = append(held, p)
	}
	for _, f := range decide(gpu, claims, procs, w.o.Stop) {
		p, h := procs[f.proc], held[f.proc]
		key := toldKey{pid: p.PID, start: h.start, reason: f.reason}
		seen[key] = true
		if w.told[key] {
			continue
		}
		// A stop that failed is tried again next round.
		w.told[key] = w.act(ctx, f, p, h)
	}
}

// observe maps a listed process to its pod, container and the claims of
// the GPU it uses; ok is false for a pod the informer does not have (yet).
func (w *Watcher) observe(lp hw.GPUProcess, p *proc, claims []Claim) (observed, bool) {
	o := observed{GPUProcess: lp}
	if p.environ != nil {
		l := limitsOf(p.environ)
		o.limits = &l
	}
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
