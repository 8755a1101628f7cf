// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podmetrics

import (
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/agent/police"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/hw"
)

// usage: per GPU with prepared devices, whether NVML listed its
// processes, and the memory each pod's processes hold on each device.
func (c *Collector) usage(out *emitter, devices []Device, p Processes) {
	byGPU := map[string][]Device{}
	uuid := map[string]string{}
	for _, d := range devices {
		// NVML does not see a GPU bound to vfio-pci.
		if d.Driver != device.GPUDriver || d.GPU == "" || d.Type == device.KindPassthrough {
			continue
		}
		byGPU[d.GPU] = append(byGPU[d.GPU], d)
		if uuid[d.GPU] == "" {
			uuid[d.GPU] = d.UUID
		}
	}
	gpus := slices.Sorted(maps.Keys(byGPU))
	c.reads.keep(gpus)
	for _, gpu := range gpus {
		l := c.reads.get(c.reader(p), gpu, c.o.MaxAge, c.o.Wait)
		if l.err != nil {
			out.gauge(processesUpDesc, 0, c.o.NodeName, uuid[gpu], gpu)
			continue
		}
		out.gauge(processesUpDesc, 1, c.o.NodeName, uuid[gpu], gpu)
		c.attribute(out, uuid[gpu], byGPU[gpu], l.procs, l.owners)
	}
}

// attribute gives each listed process's memory to the device of its
// pod's claims it runs on: on a MIG GPU the one of its GPU instance.
// What no such device covers is the GPU's unclaimed memory.
func (c *Collector) attribute(out *emitter, uuid string, devices []Device, procs []hw.GPUProcess, owners map[uint32]owner) {
	type use struct{ namespace, pod, claim, device, gi string }
	used := map[use]uint64{}
	var order []use
	unclaimed := map[string]uint64{}
	for _, p := range procs {
		mem := uint64(0)
		if p.UsedMemory != nil {
			mem = *p.UsedMemory
		}
		d, pod, gone := c.deviceOf(p, owners[p.PID], devices)
		if gone {
			continue
		}
		if d == nil {
			unclaimed[itoa(p.GPUInstance)] += mem
			continue
		}
		u := use{pod.Namespace, pod.Name, d.Claim, d.Name, itoa(d.GPUInstance)}
		if _, ok := used[u]; !ok {
			order = append(order, u)
		}
		used[u] += mem
	}
	for _, u := range order {
		out.gauge(memoryDesc, float64(used[u]), u.namespace, u.pod, u.claim, u.device, c.o.NodeName, uuid, u.gi)
	}
	for gi, mem := range unclaimed {
		out.gauge(unclaimedDesc, float64(mem), c.o.NodeName, uuid, gi)
	}
}

type podRef struct{ Namespace, Name string }

// owner is the pod and container a process's cgroup named when its GPU
// was listed.
type owner struct {
	pod       types.UID
	container string
	inPod     bool
	err       error
}

// reader lists a GPU's processes and reads, right after, the cgroup of
// each: both serve scrapes for MaxAge.
func (c *Collector) reader(p Processes) func(string) ([]hw.GPUProcess, map[uint32]owner, error) {
	return func(gpu string) ([]hw.GPUProcess, map[uint32]owner, error) {
		procs, err := p.GPUProcesses(gpu)
		if err != nil {
			return nil, nil, err
		}
		owners := make(map[uint32]owner, len(procs))
		for _, pr := range procs {
			var o owner
			o.pod, o.container, o.inPod, o.err = c.podOf(pr.PID)
			owners[pr.PID] = o
		}
		return procs, owners, nil
	}
}

// deviceOf finds the prepared device a process uses: its cgroup names its
// pod and container (as the police reads them), the container's claims
// among the GPU's devices, on a MIG GPU the one of the process's GPU
// instance. nil: none (a process of no pod, of a pod the informer does
// not have, or of no claim of the GPU); gone: the process exited.
func (c *Collector) deviceOf(p hw.GPUProcess, o owner, devices []Device) (d *Device, pod podRef, gone bool) {
	if o.err != nil {
		return nil, pod, errors.Is(o.err, errGone)
	}
	if !o.inPod {
		return nil, pod, false
	}
	po, ok := c.o.Pods.PodByUID(o.pod)
	if !ok {
		return nil, pod, false
	}
	_, claims := police.ContainerClaims(po, o.container)
	for i := range devices {
		dev := &devices[i]
		if dev.Namespace != po.Namespace || !slices.Contains(claims, dev.Claim) {
			continue
		}
		if p.GPUInstance != nil && (dev.GPUInstance == nil || *dev.GPUInstance != *p.GPUInstance) {
			continue
		}
		return dev, podRef{po.Namespace, po.Name}, false
	}
	return nil, pod, false
}

var errGone = errors.New("process gone")

// maxCgroup bounds what is read of a process's cgroup file: a path per
// hierarchy (PATH_MAX each under cgroup v1's dozen), whatever cgroups
// below its container a tenant's process made.
const maxCgroup = 64 << 10

// podOf reads the pod and container a process runs in from its cgroup
// file. Unlike the police, which may stop the process and so holds it by
// a pidfd, a scrape only reads: a PID reused between NVML's listing and
// this read names another process for one scrape, which the next one
// corrects.
func (c *Collector) podOf(pid uint32) (types.UID, string, bool, error) {
	f, err := os.Open(filepath.Join(c.o.ProcRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if errors.Is(err, os.ErrNotExist) {
		return "", "", false, errGone
	}
	if err != nil {
		return "", "", false, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCgroup))
	if errors.Is(err, unix.ESRCH) {
		return "", "", false, errGone
	}
	if err != nil {
		return "", "", false, err
	}
	uid, container, ok := police.PodOf(string(b))
	return uid, container, ok, nil
}

// listings keeps each GPU's last process listing for MaxAge, and the
// read in progress: one read per GPU at a time, which no lock is held
// across.
type listings struct {
	mu sync.Mutex
	m  map[string]*listing
}

type listing struct {
	procs  []hw.GPUProcess
	owners map[uint32]owner
	err    error
	at     time.Time
	// reading is closed when the read in progress ends; nil: none.
	reading chan struct{}
}

var errSlow = errors.New("NVML did not list the GPU's processes in time")

func newListings() *listings { return &listings{m: map[string]*listing{}} }

// get is the GPU's listing of at most maxAge, read now if older (its
// processes' cgroups read with it); a read
// that takes longer than wait goes on in the background for the next
// scrape, and this one gets errSlow.
func (l *listings) get(read listFunc, gpu string, maxAge, wait time.Duration) listing {
	l.mu.Lock()
	e := l.m[gpu]
	if e == nil {
		e = &listing{}
		l.m[gpu] = e
	}
	if e.reading == nil && !e.at.IsZero() && time.Since(e.at) < maxAge {
		got := *e
		l.mu.Unlock()
		return got
	}
	if e.reading == nil {
		e.reading = make(chan struct{})
		go l.read(read, gpu, e)
	}
	done := e.reading
	l.mu.Unlock()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		return listing{err: errSlow}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return *e
}

// listFunc lists a GPU's processes and who owns each.
type listFunc func(gpu string) ([]hw.GPUProcess, map[uint32]owner, error)

func (l *listings) read(read listFunc, gpu string, e *listing) {
	procs, owners, err := read(gpu)
	l.mu.Lock()
	defer l.mu.Unlock()
	e.procs, e.owners, e.err, e.at = procs, owners, err, time.Now()
	close(e.reading)
	e.reading = nil
}

// keep forgets the listings of GPUs no longer read, unless a read of one
// is still in progress.
func (l *listings) keep(gpus []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for g, e := range l.m {
		if e.reading == nil && !slices.Contains(gpus, g) {
			delete(l.m, g)
		}
	}
}
