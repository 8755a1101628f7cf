// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/health"
	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/hw"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
)

// Health check intervals and the kubelet's health check timeouts, per
// device kind, chosen as docs/design.md ("Health: timeouts per device
// kind") explains. Each device is re-sent every timeout/3; a monitor
// that has completed no check for 2/3 of the timeout is stalled and its
// devices are streamed Unknown until it checks again.
const (
	// A GPU check asks NVML for each GPU (handle, PCI address, recovery
	// action) through the driver's lock, which a MIG reconfiguration or a
	// GPU reset holds for seconds: three checks missed (30 s) before the
	// GPUs are Unknown. Events report XIDs at once in between.
	gpuCheckInterval = 10 * time.Second
	gpuHealthTimeout = 45 * time.Second
	// An MPS check asks each daemon through its control pipe (a process
	// each): cheap, and a dead daemon's clients wait for it.
	mpsCheckInterval = 5 * time.Second
	// A NIC check reads sysfs and netlink, which answer at once; netlink
	// reports link changes as they happen. Stalled after 20 s: four
	// checks missed. The timeout is the kubelet's default.
	nicCheckInterval = 5 * time.Second
	nicHealthTimeout = 30 * time.Second
)

// healthTimes are the monitors' check intervals and the kubelet's health
// check timeouts, per device kind (tests shorten them).
type healthTimes struct {
	gpuCheck, gpuTimeout, mpsCheck, nicCheck, nicTimeout time.Duration
}

var defaultHealthTimes = healthTimes{gpuCheck: gpuCheckInterval, gpuTimeout: gpuHealthTimeout,
	mpsCheck: mpsCheckInterval, nicCheck: nicCheckInterval, nicTimeout: nicHealthTimeout}

// Monitor names, in the Unknown message of a stalled monitor's devices.
const (
	gpuMonitorName = "the GPU health monitor (NVML events and checks)"
	nicMonitorName = "the NIC health monitor (netlink and sysfs)"
)

// passthroughUnmonitored is the health message of a GPU bound to vfio-pci.
const passthroughUnmonitored = "health unknown: a GPU bound to vfio-pci is invisible to NVML, so no health monitor watches it; the VM's guest driver is the one that sees its faults"

// nodeHealth wires the health monitors to the publisher (taints, and
// republishing when faults change) and to the kubelet (one health stream
// per driver).
type nodeHealth struct {
	cfg     *config.AgentConfig
	times   healthTimes
	policy  health.XIDPolicy
	changed *health.Broadcast // faults or published devices changed
	// republish wakes the publisher (publish.Publisher.Run): the faults,
	// and so the taints, changed.
	republish chan struct{}

	mu      sync.Mutex
	gpu     *health.GPUMonitor // nil until NVML is usable
	nic     *health.NICMonitor
	mps     *health.MPSMonitor         // nil without a GPU driver
	held    hw.Inventory               // the last probe, with what it could not tell held
	devices map[string][]health.Device // by driver, as last published
}

func newNodeHealth(cfg *config.AgentConfig, times *healthTimes) *nodeHealth {
	if times == nil {
		times = &defaultHealthTimes
	}
	return &nodeHealth{cfg: cfg, times: *times, policy: health.NewXIDPolicy(cfg.HealthPolicy()),
		changed: health.NewBroadcast(), republish: make(chan struct{}, 1), devices: map[string][]health.Device{}}
}

// Faults merges the monitors' findings: the publisher taints them
// (publish.Health).
func (h *nodeHealth) Faults() hw.Health {
	h.mu.Lock()
	gpu, nic, daemons := h.gpu, h.nic, h.mps
	h.mu.Unlock()
	var out hw.Health
	if gpu != nil {
		g := gpu.Faults()
		out.GPUs, out.Partitions = g.GPUs, g.Partitions
	}
	if daemons != nil {
		out.MPS = daemons.Faults()
	}
	if nic != nil {
		n := nic.Faults()
		out.PFs, out.VFs = n.PFs, n.VFs
	}
	return out
}

// onChange: the faults changed. Tell the streams and republish (taints).
func (h *nodeHealth) onChange() {
	h.changed.Notify()
	select {
	case h.republish <- struct{}{}:
	default:
	}
}

// Probed sees each of the publisher's probes: what a probe could not tell
// is held from the last one (health.Hold), and the monitors learn what it
// found, before the slices are built from it (publish.Health).
func (h *nodeHealth) Probed(inv hw.Inventory) hw.Inventory {
	h.mu.Lock()
	inv = health.Hold(h.held, inv)
	h.held = inv
	gpu, nic := h.gpu, h.nic
	h.mu.Unlock()
	if gpu != nil {
		gpu.Probed(inv)
	}
	if nic != nil {
		nic.Probed(inv)
	}
	return inv
}

// startNIC starts the NIC monitor on the node's netdevs: the host's, or a
// mock's veth stand-ins in their namespace (without them, sysfs only).
func (h *nodeHealth) startNIC(ctx context.Context, node *backend.Node) {
	links := &health.LinkSource{Netns: node.HostNetns}
	if node.NoLinks {
		links = nil
	}
	m := health.NewNICMonitor(node.SysfsRoot, links, h.times.nicCheck, h.onChange)
	h.start(ctx, m, func() { h.nic = m })
}

// startGPU starts the GPU monitor on an initialised NVML.
func (h *nodeHealth) startGPU(ctx context.Context, gpu *nvml.Backend) {
	m := health.NewGPUMonitor(gpu, h.policy, h.times.gpuCheck, h.onChange)
	h.start(ctx, m, func() { h.gpu = m })
}

// startMPS starts supervising the GPU driver's MPS control daemons: one
// that died is started again, and its devices are unhealthy meanwhile.
func (h *nodeHealth) startMPS(ctx context.Context, daemons *mps.Manager) {
	m := health.NewMPSMonitor(daemons, h.times.mpsCheck, h.onChange)
	h.start(ctx, m, func() { h.mps = m })
}

// start registers a monitor (register runs under h.mu), tells it what the
// last probe found and runs it.
func (h *nodeHealth) start(ctx context.Context, m interface {
	Probed(hw.Inventory)
	Run(context.Context)
}, register func()) {
	h.mu.Lock()
	register()
	held := h.held
	h.mu.Unlock()
	m.Probed(held)
	go m.Run(ctx)
}

// Published: the publisher handed a driver's slices, built from inv with
// features f, to the API. They are what the driver's stream reports on
// (publish.Health).
func (h *nodeHealth) Published(driver string, res resourceslice.DriverResources, inv hw.Inventory, f device.Features) {
	devices := h.catalog(driver, res, inv, f)
	h.mu.Lock()
	h.devices[driver] = devices
	h.mu.Unlock()
	h.changed.Notify()
}

// catalog pairs each published device with what it stands for on the
// hardware (the builders' catalogs, from the inventory it was built from).
func (h *nodeHealth) catalog(driver string, res resourceslice.DriverResources, inv hw.Inventory, f device.Features) []health.Device {
	switch driver {
	case device.GPUDriver:
		return devicesOf(res, resources.GPUDevices(inv.GPUs, inv.PassthroughGPUs, f), gpuUnmonitored)
	case device.NICDriver:
		offers, _ := h.cfg.Resolve(inv.PFs)
		return devicesOf(res, resources.NICDevices(offers, f), func(resources.NICDevice) string { return "" })
	}
	return nil
}

// gpuUnmonitored says why no monitor watches a GPU device ("" where one
// does).
func gpuUnmonitored(d resources.GPUDevice) string {
	if d.Kind == device.KindPassthrough {
		return passthroughUnmonitored
	}
	return ""
}

func devicesOf[T health.Faulty](res resourceslice.DriverResources, catalog map[string]T, unmonitored func(T) string) []health.Device {
	var out []health.Device
	for pool, p := range res.Pools {
		for _, s := range p.Slices {
			for _, d := range s.Devices {
				if of, ok := catalog[d.Name]; ok {
					out = append(out, health.Device{Pool: pool, Name: d.Name, Of: of, Unmonitored: unmonitored(of)})
				}
			}
		}
	}
	return out
}

// stream is a driver's health stream.
func (h *nodeHealth) stream(driver string) health.Stream {
	if driver == device.GPUDriver {
		return health.Stream{Source: driverHealth{h, driver}, Timeout: h.times.gpuTimeout, Monitor: gpuMonitorName}
	}
	return health.Stream{Source: driverHealth{h, driver}, Timeout: h.times.nicTimeout, Monitor: nicMonitorName}
}

// driverHealth is the node's health as one driver's stream sees it
// (health.Source).
type driverHealth struct {
	*nodeHealth
	driver string
}

// Devices are the driver's devices as last published.
func (d driverHealth) Devices() []health.Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.devices[d.driver]
}

// LastCheck is when the driver's monitor last checked its devices; zero
// without a monitor (a GPU driver of passthrough GPUs alone has none:
// its devices are all unmonitored).
func (d driverHealth) LastCheck() time.Time {
	d.mu.Lock()
	gpu, nic := d.gpu, d.nic
	d.mu.Unlock()
	switch {
	case d.driver == device.GPUDriver && gpu != nil:
		return gpu.LastCheck()
	case d.driver == device.NICDriver && nic != nil:
		return nic.LastCheck()
	}
	return time.Time{}
}

// Changed is closed at the next change of faults or published devices.
func (d driverHealth) Changed() <-chan struct{} { return d.changed.Changed() }

// withHealth serves the kubelet's health stream for a driver's plugin.
func withHealth(p kubeletplugin.DRAPlugin, s health.Stream) kubeletplugin.DRAPlugin {
	return &healthPlugin{DRAPlugin: p, stream: s}
}

type healthPlugin struct {
	kubeletplugin.DRAPlugin
	stream health.Stream
}

func (p *healthPlugin) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return p.stream.Watch(ctx, reports)
}

// drivers are those whose devices were published: they have a health
// stream to report.
func (h *nodeHealth) drivers() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Sorted(maps.Keys(h.devices))
}
