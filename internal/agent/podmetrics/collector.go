// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podmetrics

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/hwdra/hwdra/internal/hw"
)

// Claims are a driver's prepared claims' devices (the checkpoint, read
// without a lock: GPUDevices, NICDevices).
type Claims interface {
	Devices() []Device
}

// Pods are the node's pods (the agent's pod informer): which pods use a
// claim, and a process's pod by the UID its cgroup names.
type Pods interface {
	List() []*corev1.Pod
	PodByUID(uid types.UID) (*corev1.Pod, bool)
}

// Processes lists the processes with a context on a GPU, by its PCI
// address (nvml.Backend).
type Processes interface {
	GPUProcesses(busID string) ([]hw.GPUProcess, error)
}

// Published is what the node publishes: each GPU and VF of its pools,
// for how full a pool is.
type Published interface {
	Units() []Unit
}

// Unit is one GPU or VF of a published pool.
type Unit struct {
	Driver, Pool string
	// Kind is UnitGPU or UnitVF; ID the GPU's or VF's PCI address.
	Kind, ID string
}

// Unit kinds.
const (
	UnitGPU = "gpu"
	UnitVF  = "vf"
)

// VFStats reads the counters a PF's driver keeps of its VFs, by VF index;
// a driver that keeps none gives an empty map.
type VFStats interface {
	VFStats(pf string) (map[int]VFCounters, error)
}

// VFCounters are a VF's traffic counters as its PF's driver reports them
// (IFLA_VF_STATS).
type VFCounters struct {
	RxBytes, TxBytes, RxPackets, TxPackets, RxDropped, TxDropped uint64
}

// Options configure a Collector.
type Options struct {
	// NodeName is the Hostname label: what dcgm-exporter's says
	// (its NODE_NAME).
	NodeName string
	Pods     Pods
	// Published may be nil: no pool series.
	Published Published
	// VFStats may be nil: no VF counters.
	VFStats VFStats
	// ProcRoot is /proc, where a process's cgroup names its pod.
	ProcRoot string
	// MaxAge is how long a GPU's process listing serves scrapes (several
	// Prometheus replicas scrape within it at the cost of one); Wait how
	// long a scrape waits for one before it says the GPU could not be
	// read (a hung GPU stalls no scrape). Defaults: 5 s, 2 s.
	MaxAge, Wait time.Duration
}

// Collector serves the per-pod series of the node's prepared devices.
// A scrape reads the checkpoints without a lock and holds no lock across
// an NVML call: it never waits for a prepare, nor a prepare for it.
type Collector struct {
	o     Options
	reads *listings

	mu        sync.Mutex // the drivers, which start late where NVML was late
	gpu, nic  Claims
	processes Processes
}

// New makes a Collector; SetGPU and SetNIC give it the drivers.
func New(o Options) *Collector {
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	if o.MaxAge == 0 {
		o.MaxAge = 5 * time.Second
	}
	if o.Wait == 0 {
		o.Wait = 2 * time.Second
	}
	return &Collector{o: o, reads: newListings()}
}

// SetGPU gives the collector the GPU driver's claims and NVML's process
// listing.
func (c *Collector) SetGPU(claims Claims, processes Processes) {
	c.mu.Lock()
	c.gpu, c.processes = claims, processes
	c.mu.Unlock()
}

// SetNIC gives the collector the NIC driver's claims.
func (c *Collector) SetNIC(claims Claims) {
	c.mu.Lock()
	c.nic = claims
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	gpu, nic, processes := c.gpu, c.nic, c.processes
	c.mu.Unlock()
	var devices []Device
	for _, cl := range []Claims{gpu, nic} {
		if cl != nil {
			devices = append(devices, cl.Devices()...)
		}
	}
	out := newEmitter(ch)
	pods := c.o.Pods.List()
	c.info(out, devices, claimPods(pods))
	c.limits(out, devices)
	if c.o.Published != nil {
		c.pools(out, devices, c.o.Published.Units())
	}
	if processes != nil {
		c.usage(out, devices, processes)
	}
	if c.o.VFStats != nil {
		c.vfCounters(out, devices)
	}
}

// claimPods indexes the pods by the claims they name ("namespace/claim"),
// their extended resources' claim too; each claim's pods sorted.
func claimPods(pods []*corev1.Pod) map[string][]string {
	out := map[string][]string{}
	add := func(pod *corev1.Pod, claim string) {
		k := pod.Namespace + "/" + claim
		if !slices.Contains(out[k], pod.Name) {
			out[k] = append(out[k], pod.Name)
		}
	}
	for _, pod := range pods {
		for i := range pod.Spec.ResourceClaims {
			if n, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i]); err == nil && n != nil {
				add(pod, *n)
			}
		}
		if ext := pod.Status.ExtendedResourceClaimStatus; ext != nil {
			add(pod, ext.ResourceClaimName)
		}
	}
	for _, names := range out {
		slices.Sort(names)
	}
	return out
}

// info: one series per prepared device and pod that uses its claim. A
// claim no pod of the node names (yet, or any more) has none: the
// series' pod label is always a pod's (an empty one would take the
// scraped agent pod's name under honorLabels).
func (c *Collector) info(out *emitter, devices []Device, pods map[string][]string) {
	for _, d := range devices {
		for _, pod := range pods[d.Namespace+"/"+d.Claim] {
			out.gauge(infoDesc, 1, d.Namespace, pod, d.Claim, d.Request, d.Driver, d.Pool, d.Name, d.Type,
				c.o.NodeName, d.UUID, dcgmInstance(d), d.Profile, d.MIGUUID, itoa(d.ComputeInstance), d.Sharing, address(d))
		}
	}
}

// dcgmInstance is the GPU_I_ID dcgm-exporter gives the device's series:
// NVML's GPU instance ID of a MIG device (or of a MIG-backed vGPU's
// instance); none for a whole GPU or share.
func dcgmInstance(d Device) string { return itoa(d.GPUInstance) }

// address is the device's PCI address: its GPU's, or the VF's.
func address(d Device) string {
	if d.VF != "" {
		return d.VF
	}
	return d.GPU
}

// limits: what each share and each VF was given.
func (c *Collector) limits(out *emitter, devices []Device) {
	for _, d := range devices {
		if s := d.Share; s != nil {
			out.gauge(shareMemoryDesc, float64(s.Memory), d.Namespace, d.Claim, d.Request, d.Pool, d.Name, c.o.NodeName, d.UUID)
			out.gauge(shareComputeDesc, float64(s.Compute), d.Namespace, d.Claim, d.Request, d.Pool, d.Name, c.o.NodeName, d.UUID)
		}
		if d.VF == "" {
			continue
		}
		for bound, mbps := range map[string]int{"max": d.MaxTxRate, "min": d.MinTxRate} {
			if mbps > 0 {
				out.gauge(vfRateDesc, float64(mbps)*1e6, d.Namespace, d.Claim, d.Request, d.Pool, d.Name, d.VF, bound)
			}
		}
	}
}

// pools: each pool's GPUs and VFs, and those a prepared claim holds.
func (c *Collector) pools(out *emitter, devices []Device, units []Unit) {
	type key struct{ driver, pool, kind string }
	size := map[key]int{}
	published := map[key]map[string]bool{}
	for _, u := range units {
		k := key{u.Driver, u.Pool, u.Kind}
		if published[k] == nil {
			published[k] = map[string]bool{}
		}
		if !published[k][u.ID] {
			published[k][u.ID] = true
			size[k]++
		}
	}
	used := map[key]map[string]bool{}
	for _, d := range devices {
		k, id := key{d.Driver, d.Pool, UnitGPU}, d.GPU
		if d.VF != "" {
			k.kind, id = UnitVF, d.VF
		}
		if published[k][id] {
			if used[k] == nil {
				used[k] = map[string]bool{}
			}
			used[k][id] = true
		}
	}
	for k, n := range size {
		out.gauge(poolSizeDesc, float64(n), k.driver, k.pool, k.kind)
		out.gauge(poolUsedDesc, float64(len(used[k])), k.driver, k.pool, k.kind)
	}
}

// emitter sends each series once: two with the same labels would fail
// the whole scrape (the registry refuses duplicates), and a label value
// the client library refuses (not UTF-8) drops that series alone.
type emitter struct {
	ch   chan<- prometheus.Metric
	seen map[series]bool
}

type series struct {
	desc   *prometheus.Desc
	labels string
}

func newEmitter(ch chan<- prometheus.Metric) *emitter {
	return &emitter{ch: ch, seen: map[series]bool{}}
}

func (e *emitter) gauge(d *prometheus.Desc, v float64, labels ...string) {
	e.send(d, prometheus.GaugeValue, v, labels)
}

func (e *emitter) counter(d *prometheus.Desc, v float64, labels ...string) {
	e.send(d, prometheus.CounterValue, v, labels)
}

func (e *emitter) send(d *prometheus.Desc, t prometheus.ValueType, v float64, labels []string) {
	k := series{d, strings.Join(labels, "\xff")}
	if e.seen[k] {
		return
	}
	e.seen[k] = true
	m, err := prometheus.NewConstMetric(d, t, v, labels...)
	if err != nil {
		return
	}
	e.ch <- m
}
