// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package publish keeps a node's ResourceSlices equal to what its hardware
// can deliver: it probes the node, leaves out the GPUs that are NVIDIA's
// device plugin's (owned), builds each driver's slices
// (slices/resources.ForNode: the one place that decides what a node
// publishes) and hands them to a ResourceSlice controller per driver
// (k8s.io/dynamic-resource-allocation/resourceslice) only when they
// differ, so a node at rest makes no API writes. Around that: the fallback
// to a device model the API server keeps when a DRA feature gate is off,
// checked at start and periodically (features.go), the check that each publication reached the API server
// (verify.go) and the publisher's own metrics (metrics.go).
package publish

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
	"github.com/hwdra/hwdra/internal/hw"
)

// Options configure a Publisher.
type Options struct {
	// NodeName names the node, its pools and the slices' owner.
	NodeName string
	// Client writes ResourceSlices. The agent gives the publisher a
	// client of its own, so that a prepare's claim GET never waits behind
	// slice writes in a shared rate limiter.
	Client kubernetes.Interface
	// Config decides which PFs are offered, how, and how faults taint.
	Config *config.AgentConfig
	// Registry takes the publisher's metrics.
	Registry prometheus.Registerer
	// Hardware is what the publisher probes: the node's backends.
	Hardware Hardware
	// Inventory is what the node held when first read: Current until the
	// first Refresh.
	Inventory hw.Inventory
	// Health is the health side of the loop; nil: no faults, nobody to
	// tell.
	Health Health
	// DevicePlugin says whether NVIDIA's device plugin serves GPUs on the
	// node; nil: it does not. The GPUs the configuration does not give the
	// agent are then left out of the slices (config.AgentConfig.OwnGPUs).
	DevicePlugin DevicePlugin

	// Events records a Warning Event on the Node when the API server
	// refuses the node's slices (refused.go); nil: none.
	Events events.EventRecorder
	// Resync is how long a publication may stay unverified before it is
	// handed to its controller again (refused.go); 0: 30 s.
	Resync time.Duration

	// RecheckFeatures is how often Run checks which DRA features' fields
	// the API server keeps (features.go: one dry-run create each time);
	// 0: 10 minutes.
	RecheckFeatures time.Duration
}

// Hardware reads the node's hardware: backend.Node.
type Hardware interface {
	Inventory(ctx context.Context) (hw.Inventory, error)
}

// Health is the health side of the loop (the agent's node health). It
// sees each probe and returns the inventory to publish (it holds what a
// probe could not tell, and its monitors learn what the probe found);
// its Faults are published as taints; it learns each publication (a
// driver's resources as handed to the API, and the inventory and
// features they were built from), which its kubelet health streams
// report on.
type Health interface {
	Probed(hw.Inventory) hw.Inventory
	Faults() hw.Health
	Published(driver string, res resourceslice.DriverResources, inv hw.Inventory, f device.Features)
}

// DevicePlugin says why NVIDIA's device plugin is taken to serve GPUs on
// the node now (deviceplugin.Watcher); nothing: it is not.
type DevicePlugin interface {
	Why() []string
}

// Unclaimed is a driver's view of the node without the hardware state it
// made for claims: it probes through probe and leaves that state out
// (prepare/gpu's Driver, which repeats the probe while its ledger changed
// meanwhile). The slices are built from this view, so preparing and
// unpreparing claims never rewrites them.
type Unclaimed interface {
	Unclaimed(probe func() (hw.Inventory, error)) (hw.Inventory, error)
}

// Publisher keeps each served driver's ResourceSlices equal to what the
// hardware can deliver. It probes on a timer, when poked and when told of
// a change; what the agent made for claims is left out of the probe
// (AddUnclaimed), so claims never cause a write either; what the scheduler
// cannot know does (a partition made outside the agent, devices appearing
// or lost, links, health taints).
type Publisher struct {
	opts      Options
	unclaimed []Unclaimed // applied to every probe, in order
	drivers   []string    // served: a pool is published for each

	updateMu sync.Mutex // serialises update
	mu       sync.Mutex
	inv      hw.Inventory
	features device.Features
	// featuresChecked: a feature check has succeeded (features.go).
	featuresChecked bool
	published       map[string]resourceslice.DriverResources
	controllers     map[string]*resourceslice.Controller
	skipped         map[string]bool // PFs already logged as not offered
	withheld        string          // why GPUs are left to the device plugin, "" if none
	// kinds are the published devices' kinds, by driver and device name.
	kinds map[string]map[string]string
	// verified is, by driver, nil once the last publication is in the API
	// server, else why not (verify.go); verifyPoke wakes the check.
	verified   map[string]error
	verifyPoke chan struct{}
	// handed is when each driver's publication was last handed to its
	// controller (refused.go).
	handed map[string]time.Time
	// refusal is, by driver, the last write the API server refused, until
	// a publication is verified.
	refusal map[string]error

	poke    chan struct{}
	metrics *metrics
}

// New returns a publisher that serves no driver yet and has started no
// controller.
func New(opts Options) *Publisher {
	if opts.RecheckFeatures == 0 {
		opts.RecheckFeatures = 10 * time.Minute
	}
	if opts.Resync == 0 {
		opts.Resync = defaultResync
	}
	p := &Publisher{
		opts:        opts,
		inv:         opts.Inventory,
		features:    device.AllFeatures,
		published:   map[string]resourceslice.DriverResources{},
		controllers: map[string]*resourceslice.Controller{},
		skipped:     map[string]bool{},
		kinds:       map[string]map[string]string{},
		verified:    map[string]error{},
		handed:      map[string]time.Time{},
		refusal:     map[string]error{},
		verifyPoke:  make(chan struct{}, 1),
		poke:        make(chan struct{}, 1),
	}
	p.metrics = newMetrics(opts.Registry, p)
	return p
}

// AddUnclaimed makes every later probe go through a driver's unclaimed
// view. Add it before the probe that first publishes the driver.
func (p *Publisher) AddUnclaimed(u Unclaimed) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unclaimed = append(slices.Clone(p.unclaimed), u)
}

// Serve makes the publisher publish a driver's pool from the next
// publication on. Drivers may come late (the GPU driver once NVML is up);
// serve one only once its kubelet plugin serves, so that a pod placed on a
// published device finds its driver.
func (p *Publisher) Serve(driver string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drivers = append(slices.Clone(p.drivers), driver)
	p.metrics.refusals.WithLabelValues(driver) // a series from the start
}

// served are the drivers whose pools are published.
func (p *Publisher) served() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drivers
}

// Poke asks for a rescan soon; it never blocks.
func (p *Publisher) Poke() {
	select {
	case p.poke <- struct{}{}:
	default:
	}
}

// Run rescans and publishes what changed until ctx ends: every interval,
// when poked, and at each signal on changes. It checks each publication
// against the API server, and every RecheckFeatures which DRA features'
// fields the API server keeps (a gate turned off or on since).
func (p *Publisher) Run(ctx context.Context, interval time.Duration, changes <-chan struct{}) {
	go p.verifyLoop(ctx)
	go p.checkFeaturesEvery(ctx, p.opts.RecheckFeatures)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.poke:
		case <-changes:
		}
		if !p.Refresh(ctx) {
			return
		}
		if err := p.Publish(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Publishing devices")
		}
		// Counted once the rescan is over: whatever it handed to the API
		// is handed by then (tests wait on it before asserting that a
		// node at rest writes nothing).
		p.metrics.rescans.Inc()
	}
}

// Refresh probes the node and keeps what it found for Current and the next
// publication. It reports false when ctx ended.
func (p *Publisher) Refresh(ctx context.Context) bool {
	inv, err := p.probe(ctx)
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		// Devices that could be read are still published; a device that
		// vanished is better gone from the slices than offered.
		klog.FromContext(ctx).Error(err, "Some devices could not be read")
	}
	p.mu.Lock()
	p.inv = inv
	p.mu.Unlock()
	return true
}

// probe probes the node through each driver's unclaimed view.
func (p *Publisher) probe(ctx context.Context) (hw.Inventory, error) {
	p.mu.Lock()
	views := p.unclaimed
	p.mu.Unlock()
	probe := func() (hw.Inventory, error) { return p.opts.Hardware.Inventory(ctx) }
	for _, u := range views {
		inner := probe
		probe = func() (hw.Inventory, error) { return u.Unclaimed(inner) }
	}
	inv, err := probe()
	if p.opts.Health != nil {
		inv = p.opts.Health.Probed(inv)
	}
	return inv, err
}

// Current returns the last probed inventory and the slice features in
// use: prepare looks allocated devices up in what was published.
func (p *Publisher) Current() (hw.Inventory, device.Features) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inv, p.features
}

// faults is what the health monitors found wrong now.
func (p *Publisher) faults() hw.Health {
	if p.opts.Health == nil {
		return hw.Health{}
	}
	return p.opts.Health.Faults()
}

// Publish builds the served drivers' slices from the last probe and hands
// those that changed to their controllers.
func (p *Publisher) Publish(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	p.mu.Lock()
	inv, features := p.inv, p.features
	p.mu.Unlock()
	inv, withheld := p.owned(inv)
	p.logWithheld(logger, withheld)
	res, skipped := resources.ForNode(p.opts.NodeName, inv, p.opts.Config, features, p.faults())
	p.logSkipped(logger, skipped)
	var errs []error
	for _, driver := range p.served() {
		want := res[driver]
		p.mu.Lock()
		have, ok := p.published[driver]
		p.mu.Unlock()
		if ok && equality.Semantic.DeepEqual(want, have) {
			continue
		}
		if err := p.update(ctx, driver, want); err != nil {
			errs = append(errs, err)
			continue
		}
		p.metrics.publications.WithLabelValues(driver).Inc()
		p.countKinds(driver, want)
		p.toVerify(driver, errNotVerified)
		logger.V(2).Info("Publishing changed devices", "driver", driver, "devices", countDevices(want))
		if p.opts.Health != nil {
			p.opts.Health.Published(driver, want, inv, features)
		}
	}
	return errors.Join(errs...)
}

// update hands a driver's slices to its controller, which writes them
// in the background and retries failed writes with backoff, reporting
// errors (dropped fields among them) to HandleError.
func (p *Publisher) update(ctx context.Context, driver string, res resourceslice.DriverResources) error {
	// Starting a controller waits for its informer's first sync (a second
	// or more): under updateMu, not mu, which prepares (Current) and
	// metric scrapes take.
	p.updateMu.Lock()
	defer p.updateMu.Unlock()
	// The controller keeps what it is given: its own copy.
	own := res.DeepCopy()
	p.mu.Lock()
	c := p.controllers[driver]
	p.mu.Unlock()
	if c != nil {
		c.Update(own)
	} else {
		logger := klog.LoggerWithName(klog.FromContext(ctx), "ResourceSlice controller")
		var err error
		c, err = resourceslice.StartController(klog.NewContext(ctx, logger), resourceslice.Options{
			DriverName: driver,
			KubeClient: p.opts.Client,
			Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: p.opts.NodeName},
			Resources:  own,
			ErrorHandler: func(ctx context.Context, err error, msg string) {
				p.toVerify(driver, err)
				if refused(err) {
					p.reportRefusal(ctx, driver, err)
				}
				p.HandleError(ctx, err, msg)
			},
		})
		if err != nil {
			return fmt.Errorf("publish %s: %w", driver, err)
		}
	}
	p.mu.Lock()
	p.controllers[driver] = c
	p.published[driver] = res
	p.handed[driver] = time.Now()
	p.mu.Unlock()
	return nil
}

// Stop stops the controllers; what they wrote stays.
func (p *Publisher) Stop() {
	// Not under mu: a stopping controller may be in its error handler,
	// which takes mu.
	p.mu.Lock()
	controllers := maps.Clone(p.controllers)
	p.mu.Unlock()
	for _, c := range controllers {
		c.Stop()
	}
}

func (p *Publisher) logSkipped(logger klog.Logger, skipped []config.Skip) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := map[string]bool{}
	for _, s := range skipped {
		now[s.String()] = true
		if !p.skipped[s.String()] {
			logger.Info("PF not offered", "pf", s.PCIAddress, "netdev", s.Netdev, "reason", s.Reason)
		}
	}
	p.skipped = now
}

// withholding is the GPUs a publication leaves to NVIDIA's device
// plugin, and why.
type withholding struct {
	gpus []hw.GPU
	of   int // the node's GPUs
	why  string
}

// owned is the inventory with only the GPUs the agent owns now: the one
// place where the device plugin's share is taken out of what is
// published.
func (p *Publisher) owned(inv hw.Inventory) (hw.Inventory, withholding) {
	var signals []string
	if p.opts.DevicePlugin != nil {
		signals = p.opts.DevicePlugin.Why()
	}
	own, left, why := p.opts.Config.OwnGPUs(inv.GPUs, len(signals) > 0)
	if len(signals) > 0 && len(left) > 0 {
		why += ": " + strings.Join(signals, ", ")
	}
	inv.GPUs = own
	return inv, withholding{gpus: left, of: len(own) + len(left), why: why}
}

// logWithheld says, when it changes, which GPUs are left to the device
// plugin and why, and keeps it for Withheld and the metric.
func (p *Publisher) logWithheld(logger klog.Logger, w withholding) {
	now := ""
	if len(w.gpus) > 0 {
		now = fmt.Sprintf("%d of %d GPUs not published: %s", len(w.gpus), w.of, w.why)
	}
	p.mu.Lock()
	before := p.withheld
	p.withheld = now
	p.mu.Unlock()
	p.metrics.withheld.Set(float64(len(w.gpus)))
	switch {
	case now == before:
	case now != "":
		var addrs []string
		for _, g := range w.gpus {
			addrs = append(addrs, g.PCIBusID)
		}
		logger.Info("Leaving GPUs to NVIDIA's device plugin: not publishing them, so that no GPU is offered twice", "gpus", addrs, "reason", w.why)
	default:
		logger.Info("Publishing every GPU again: NVIDIA's device plugin no longer serves GPUs on this node", "was", before)
	}
}

// Withheld says why GPUs are left out of the slices for NVIDIA's device
// plugin ("8 of 8 GPUs not published: NVIDIA's device plugin serves GPUs
// on this node: its socket ..."), "" when none are.
func (p *Publisher) Withheld() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.withheld
}

func countDevices(res resourceslice.DriverResources) int {
	n := 0
	for _, p := range res.Pools {
		for _, s := range p.Slices {
			n += len(s.Devices)
		}
	}
	return n
}
