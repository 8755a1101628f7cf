package publish

import (
	"context"
	"errors"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/slices/device"
	"github.com/hwdra/hwdra/slices/resources"
)

// gates names the DRA feature gates behind each slice feature, as the
// resourceslice library reports them dropped.
var gates = []struct {
	name string
	flag func(*device.Features) *bool
}{
	{"DRAPartitionableDevices", func(f *device.Features) *bool { return &f.PartitionableDevices }},
	{"DRADeviceCompatibilityGroups", func(f *device.Features) *bool { return &f.CompatibilityGroups }},
	{"DRAConsumableCapacity", func(f *device.Features) *bool { return &f.ConsumableCapacity }},
	{"DRADeviceTaints", func(f *device.Features) *bool { return &f.DeviceTaints }},
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
		p.dropFeatures(ctx, dropped.DisabledFeatures())
		return
	}
	klog.FromContext(ctx).Error(err, msg)
}

// dropFeatures is called when the API server dropped fields of our slices
// because a DRA feature gate is off. It falls back to a model without those
// features and republishes, so the pool stays usable.
func (p *Publisher) dropFeatures(ctx context.Context, dropped []string) {
	p.mu.Lock()
	f := without(p.features, dropped)
	changed := f != p.features
	p.features = f
	p.mu.Unlock()
	for _, g := range dropped {
		p.metrics.fallbacks.WithLabelValues(g).Set(1)
	}
	if !changed {
		return
	}
	klog.FromContext(ctx).Error(nil, "The API server dropped fields of our ResourceSlices: a DRA feature gate is off in this cluster. Falling back to a device model without it; enable the gate in kube-apiserver and kube-scheduler for the full model",
		"missingGates", slices.Sorted(slices.Values(dropped)), "features", f)
	p.Poke()
}

// recheckFeatures runs while a fallback model is published: it asks the API
// server whether it keeps the full model's fields now (a gate turned on
// after the agent started) by a server-side dry run of the full model's
// slices, which stores nothing, and returns to the fullest model it keeps.
func (p *Publisher) recheckFeatures(ctx context.Context) {
	p.mu.Lock()
	current, inv := p.features, p.inv
	p.mu.Unlock()
	if current == device.AllFeatures {
		return
	}
	logger := klog.FromContext(ctx)
	inv, _ = p.owned(inv)
	res, _ := resources.ForNode(p.opts.NodeName, inv, p.opts.Config, device.AllFeatures, p.faults())
	var dropped []string
	for _, driver := range p.served() {
		for _, s := range resources.Objects(driver, p.opts.NodeName, res[driver]) {
			desired := s.DeepCopy()
			desired.Name, desired.GenerateName = "", "hwdra-feature-check-"
			got, err := p.opts.Client.ResourceV1().ResourceSlices().Create(ctx, desired, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err != nil {
				logger.V(2).Info("Checking whether the API server keeps the full device model failed; trying later", "err", err)
				return
			}
			dropped = append(dropped, (&resourceslice.DroppedFieldsError{DesiredSlice: desired, ActualSlice: got}).DisabledFeatures()...)
		}
	}
	want := without(device.AllFeatures, dropped)
	if want == current || !more(want, current) {
		return
	}
	p.mu.Lock()
	p.features = want
	p.mu.Unlock()
	for _, g := range gates {
		if !slices.Contains(dropped, g.name) {
			p.metrics.fallbacks.WithLabelValues(g.name).Set(0)
		}
	}
	logger.Info("The API server keeps the fields of more DRA features now: publishing the fuller device model",
		"features", want, "stillMissingGates", slices.Sorted(slices.Values(dropped)))
	p.Poke()
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
