// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// A DRA feature gate that is off makes the API server drop the fields it
// guards, but only where the stored object does not use them already
// (k8s.io/kubernetes v1.37.2, pkg/registry/resource/resourceslice,
// dropDisabledFields: a create drops them always, an update keeps them
// when the old slice had them). So slices written while a gate was on keep
// their fields through every later update, the controller sees nothing
// dropped, and the scheduler, with the gate off, ignores each slice that
// uses them, which leaves the whole pool incomplete and unallocatable
// (k8s.io/dynamic-resource-allocation v0.37.2, structured/internal/*/
// pools_*.go GatherPools: slices with shared counters without
// PartitionableDevices, slices with compatibility groups without
// CompatibilityGroups; the allocator skips incomplete pools).
//
// Only a create tells, so the publisher asks with a server-side dry run
// (nothing stored) of one small slice whose one device carries a field of
// every gate the model uses: at start, before the first publication, and
// every RecheckFeatures (10 minutes) after. One API request per check,
// independent of the node's size.

// gates names the DRA feature gates behind each slice feature, as the
// resourceslice library reports them dropped; what the model leaves out
// without each (lost); and how the feature check puts the gate's fields
// on its probe device (use).
var gates = []struct {
	name string
	flag func(*device.Features) *bool
	lost string
	use  func(d *resourceapi.Device, driver string)
}{
	{"DRAPartitionableDevices", func(f *device.Features) *bool { return &f.PartitionableDevices },
		"no MIG partitions to create and no GPU shares: whole GPUs and existing MIG instances only",
		func(d *resourceapi.Device, _ string) { probeConsumption(d) }},
	{"DRADeviceCompatibilityGroups", func(f *device.Features) *bool { return &f.CompatibilityGroups },
		"no vGPU devices",
		func(d *resourceapi.Device, _ string) { probeConsumption(d).CompatibilityGroups = []string{probeName} }},
	{"DRAConsumableCapacity", func(f *device.Features) *bool { return &f.ConsumableCapacity },
		"no GPU shares and no bandwidth shares of a PF: whole GPUs, and its VFs offered one device each",
		func(d *resourceapi.Device, _ string) { d.AllowMultipleAllocations = ptr.To(true) }},
	{"DRADeviceTaints", func(f *device.Features) *bool { return &f.DeviceTaints },
		"unhealthy devices are not tainted",
		func(d *resourceapi.Device, driver string) {
			d.Taints = []resourceapi.DeviceTaint{{Key: driver + "/" + probeName, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		}},
}

// probeName names the feature check's slice, device, counter set and
// group.
const probeName = "feature-check"

// probeConsumption is the probe device's counter consumption, made on
// first use.
func probeConsumption(d *resourceapi.Device) *resourceapi.DeviceCounterConsumption {
	if len(d.ConsumesCounters) == 0 {
		d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{
			CounterSet: probeName,
			Counters:   map[string]resourceapi.Counter{"check": {Value: resource.MustParse("1")}},
		}}
	}
	return &d.ConsumesCounters[0]
}

// probeSlice is the feature check's slice for the node: one device with a
// field of every gate. Its driver is one the agent writes slices for and
// its pool the node's (the admission policy allows no other); a dry run
// stores nothing, so it never meets the node's real pool.
func probeSlice(node, driver string) *resourceapi.ResourceSlice {
	d := resourceapi.Device{Name: probeName}
	for _, g := range gates {
		g.use(&d, driver)
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "hwdra-" + probeName + "-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices:  []resourceapi.Device{d},
		},
	}
}

// without is f with the features of the named gates off.
func without(f device.Features, off []string) device.Features {
	for _, g := range gates {
		if slices.Contains(off, g.name) {
			*g.flag(&f) = false
		}
	}
	return f
}

// HandleError handles the ResourceSlice controllers' background errors
// (and the kubelet plugins', which the agent routes here): dropped fields
// make the publisher fall back; everything else is logged (and retried by
// the controller).
func (p *Publisher) HandleError(ctx context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) {
		p.mu.Lock()
		f := without(p.features, dropped.DisabledFeatures())
		p.mu.Unlock()
		p.useFeatures(ctx, f)
		return
	}
	klog.FromContext(ctx).Error(err, msg)
}

// CheckFeatures asks the API server which DRA features' fields it keeps,
// by a dry-run create of the probe slice (stores nothing), and publishes
// the fullest model it keeps from the next publication on. It is a no-op
// until a driver is served. An error (the API server unreachable) leaves
// the model as it is.
func (p *Publisher) CheckFeatures(ctx context.Context) error {
	served := p.served()
	if len(served) == 0 {
		return nil
	}
	f, err := ProbeFeatures(ctx, p.opts.Client, p.opts.NodeName, served[0])
	if err != nil {
		return err
	}
	p.useFeatures(ctx, f)
	p.mu.Lock()
	p.featuresChecked = true
	p.mu.Unlock()
	return nil
}

// ProbeFeatures asks the API server which DRA features' fields it keeps
// in the ResourceSlices of a driver (one the agent writes, which the
// chart's admission policy allows) on a node: a dry-run create of the
// probe slice, which stores nothing. CheckFeatures and `hwdra doctor` ask
// so.
func ProbeFeatures(ctx context.Context, client kubernetes.Interface, node, driver string) (device.Features, error) {
	desired := probeSlice(node, driver)
	got, err := client.ResourceV1().ResourceSlices().Create(ctx, desired.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return device.Features{}, fmt.Errorf("checking which DRA features the API server keeps (a dry-run create of a ResourceSlice): %w", err)
	}
	dropped := (&resourceslice.DroppedFieldsError{DesiredSlice: desired, ActualSlice: got}).DisabledFeatures()
	return without(device.AllFeatures, dropped), nil
}

// FeatureGate is a DRA feature gate the device model uses: whether a
// model has it, and what the model leaves out without it.
type FeatureGate struct {
	Name    string
	On      bool
	Without string
}

// Gates are the DRA feature gates the device model uses, in the order
// the publisher checks them, as f has them.
func Gates(f device.Features) []FeatureGate {
	out := make([]FeatureGate, 0, len(gates))
	for _, g := range gates {
		out = append(out, FeatureGate{Name: g.name, On: *g.flag(&f), Without: g.lost})
	}
	return out
}

// checkFeaturesEvery runs CheckFeatures until ctx ends: every interval,
// and 30 s after a failed check (also one before Run).
func (p *Publisher) checkFeaturesEvery(ctx context.Context, interval time.Duration) {
	const retry = 30 * time.Second
	p.mu.Lock()
	first := interval
	if !p.featuresChecked {
		first = min(interval, retry)
	}
	p.mu.Unlock()
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := interval
		if err := p.CheckFeatures(ctx); err != nil && ctx.Err() == nil {
			next = min(interval, retry)
			klog.FromContext(ctx).Info("Warning: cannot tell which DRA features the API server keeps; the device model stays as it is", "err", err, "retryIn", next)
		}
		t.Reset(next)
	}
}

// useFeatures makes f the slice features from the next publication on,
// says so (an error when it lacks one the agent used, with the gates and
// what the model leaves out) and sets hwdra_feature_disabled.
func (p *Publisher) useFeatures(ctx context.Context, f device.Features) {
	p.mu.Lock()
	old := p.features
	p.features = f
	p.mu.Unlock()
	for _, g := range gates {
		off := 0.0
		if !*g.flag(&f) {
			off = 1
		}
		p.metrics.fallbacks.WithLabelValues(g.name).Set(off)
	}
	if f == old {
		return
	}
	logger := klog.FromContext(ctx)
	if names, lost := missing(f); !more(f, old) && len(names) > 0 {
		logger.Error(nil, "The API server drops fields of our ResourceSlices: a DRA feature gate is off in this cluster. "+
			"Publishing a device model without it (a pool with those fields would be ignored by the scheduler); "+
			"enable the gate in kube-apiserver and kube-scheduler for the full model",
			"missingGates", names, "features", f, "withoutThem", strings.Join(lost, "; "))
	} else {
		logger.Info("The API server keeps the fields of more DRA features now: publishing the fuller device model",
			"features", f, "stillMissingGates", names)
	}
	p.Poke()
}

// Degraded is nil while the full device model is published, else which
// DRA feature gates the API server has off and what the published model
// leaves out for it: the readiness probe says so (the node serves).
func (p *Publisher) Degraded() error {
	p.mu.Lock()
	f := p.features
	p.mu.Unlock()
	if f == device.AllFeatures {
		return nil
	}
	names, lost := missing(f)
	return fmt.Errorf("publishing without DRA features the API server drops (%s): %s", strings.Join(names, ", "), strings.Join(lost, "; "))
}

// missing are the gates of the features f lacks, and what the model
// leaves out without each.
func missing(f device.Features) (gateNames, lost []string) {
	for _, g := range Gates(f) {
		if !g.On {
			gateNames, lost = append(gateNames, g.Name), append(lost, g.Without)
		}
	}
	return gateNames, lost
}

// more reports whether a has every feature b has, and one more.
func more(a, b device.Features) bool {
	gained := false
	for _, g := range gates {
		ha, hb := *g.flag(&a), *g.flag(&b)
		if hb && !ha {
			return false
		}
		gained = gained || ha && !hb
	}
	return gained
}
