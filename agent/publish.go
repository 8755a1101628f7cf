package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/config"
	"github.com/hwdra/hwdra/hw"

	"github.com/hwdra/hwdra/slices/device"
	"github.com/hwdra/hwdra/slices/resources"
)

// publisher keeps each driver's ResourceSlices equal to what the hardware
// can deliver. It probes on a timer and when the hardware signals a change,
// and hands the slices to a ResourceSlice controller per driver only when
// they differ: a node at rest makes no API writes. The probe leaves out
// what the agent made for claims (see gpu.Driver.Unclaimed), so claims
// never cause a write either; what the scheduler cannot know does (a
// partition made outside the agent, devices appearing or lost, links).
type publisher struct {
	nodeName string
	client   kubernetes.Interface // for slices only: see newClients
	probe    func(context.Context) (hw.Inventory, error)
	cfg      *config.AgentConfig
	drivers  []string // served: a pool is published for each

	updateMu    sync.Mutex // serialises update
	mu          sync.Mutex
	inv         hw.Inventory
	features    device.Features
	published   map[string]resourceslice.DriverResources
	controllers map[string]*resourceslice.Controller
	skipped     map[string]bool // PFs already logged as not offered
	// kinds are the published devices' kinds, by driver and device name
	// (metrics).
	kinds map[string]map[string]string
	// verified is, by driver, nil once the last publication is in the API
	// server, else why not (verify.go); verifyPoke wakes the check.
	verified   map[string]error
	verifyPoke chan struct{}

	poke    chan struct{}
	metrics *metrics
	// recheckEvery: how often a fallback model checks whether the API
	// server keeps the full model's fields again.
	recheckEvery time.Duration
	// faults are the health monitors' findings, tainted in the slices,
	// and afterPublish learns what was published (agent/health.go).
	faults       func() hw.Health
	afterPublish func(driver string)
}

func newPublisher(nodeName string, client kubernetes.Interface, cfg *config.AgentConfig, m *metrics) *publisher {
	p := &publisher{
		nodeName:     nodeName,
		client:       client,
		cfg:          cfg,
		features:     device.AllFeatures,
		published:    map[string]resourceslice.DriverResources{},
		controllers:  map[string]*resourceslice.Controller{},
		skipped:      map[string]bool{},
		kinds:        map[string]map[string]string{},
		verified:     map[string]error{},
		verifyPoke:   make(chan struct{}, 1),
		poke:         make(chan struct{}, 1),
		metrics:      m,
		recheckEvery: 10 * time.Minute,
	}
	m.registry.MustRegister(sliceWrites{p})
	return p
}

// Poke asks for a rescan soon; it never blocks.
func (p *publisher) Poke() {
	select {
	case p.poke <- struct{}{}:
	default:
	}
}

// run rescans until ctx ends: periodically, when poked, and when the
// hardware signals a change.
func (p *publisher) run(ctx context.Context, interval time.Duration, changes <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	recheck := time.NewTicker(p.recheckEvery)
	defer recheck.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.poke:
		case <-changes:
		case <-recheck.C:
			p.recheckFeatures(ctx)
			continue
		}
		if err := p.sync(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Publishing devices")
		}
	}
}

// sync probes, builds and publishes what changed.
func (p *publisher) sync(ctx context.Context) error {
	if !p.refresh(ctx) {
		return nil // stopping
	}
	return p.publishCurrent(ctx)
}

// refresh probes the node and keeps what it found for prepare's catalog
// (current) and the next publication. It reports false when ctx ended.
func (p *publisher) refresh(ctx context.Context) bool {
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

// publishCurrent builds the slices of the last probe and publishes what
// changed.
func (p *publisher) publishCurrent(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	p.mu.Lock()
	inv, features := p.inv, p.features
	p.mu.Unlock()
	res, skipped := resources.ForNode(p.nodeName, inv, p.cfg, features, p.health())
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
		p.metrics.writes.WithLabelValues(driver).Inc()
		p.countKinds(driver, want)
		p.markPublished(driver)
		logger.V(2).Info("Publishing changed devices", "driver", driver, "devices", countDevices(want))
		if p.afterPublish != nil {
			p.afterPublish(driver)
		}
	}
	return errors.Join(errs...)
}

// update hands a driver's slices to its controller, which writes them
// in the background and retries failed writes with backoff, reporting
// errors (dropped fields among them) to onError.
func (p *publisher) update(ctx context.Context, driver string, res resourceslice.DriverResources) error {
	// Starting a controller waits for its informer's first sync (a second
	// or more): under updateMu, not mu, which prepares (current) and
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
			KubeClient: p.client,
			Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: p.nodeName},
			Resources:  own,
			ErrorHandler: func(ctx context.Context, err error, msg string) {
				p.publishFailed(driver, err)
				p.onError(ctx, err, msg)
			},
		})
		if err != nil {
			return fmt.Errorf("publish %s: %w", driver, err)
		}
	}
	p.mu.Lock()
	p.controllers[driver] = c
	p.published[driver] = res
	p.mu.Unlock()
	return nil
}

// stop stops the controllers; what they wrote stays.
func (p *publisher) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.controllers {
		c.Stop()
	}
}

func (p *publisher) logSkipped(logger klog.Logger, skipped []config.Skip) {
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

// current returns the last probed inventory and the features in use.
func (p *publisher) current() (hw.Inventory, device.Features) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inv, p.features
}

// countKinds records the kind of every published device of a driver and
// sets the published-devices gauges.
func (p *publisher) countKinds(driver string, res resourceslice.DriverResources) {
	kinds := map[string]string{}
	count := map[string]int{}
	for _, pool := range res.Pools {
		for _, s := range pool.Slices {
			for i := range s.Devices {
				k := deviceKind(driver, &s.Devices[i])
				kinds[s.Devices[i].Name] = k
				count[k]++
			}
		}
	}
	p.mu.Lock()
	p.kinds[driver] = kinds
	p.mu.Unlock()
	p.metrics.devices.DeletePartialMatch(prometheus.Labels{"driver": driver})
	for k, n := range count {
		p.metrics.devices.WithLabelValues(driver, k).Set(float64(n))
	}
}

// kindOf is a published device's kind.
func (p *publisher) kindOf(driver, device string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k, ok := p.kinds[driver][device]; ok {
		return k
	}
	return kindUnknown
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
