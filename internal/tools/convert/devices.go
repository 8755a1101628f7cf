// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package convert

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// deviceClass converts a DeviceClass of the user's own (NVIDIA's stock
// classes are left out: hwdra's chart has their equivalents); its name
// stays, so the claims that name it still do.
func (c *converter) deviceClass(d *doc, spec *resourceapi.DeviceClassSpec) bool {
	p := field.NewPath("spec")
	changed := c.selectors(d, spec.Selectors, p.Child("selectors"))
	var cfgChanged bool
	spec.Config, cfgChanged = configs(c, d, spec.Config, func(x *resourceapi.DeviceClassConfiguration) *resourceapi.OpaqueDeviceConfiguration { return x.Opaque }, p.Child("config"))
	return cfgChanged || changed
}

// configs converts the opaque configs of a class or a claim, leaving out
// those that convert to nothing; changed reports whether any was touched.
func configs[T any](c *converter, d *doc, list []T, opaque func(*T) *resourceapi.OpaqueDeviceConfiguration, p *field.Path) (kept []T, changed bool) {
	kept = list[:0]
	for i := range list {
		if o := opaque(&list[i]); o != nil {
			res := convertOpaque(o)
			changed = c.apply(d, res, o, p.Index(i).Child("opaque")) || changed
			if res.drop {
				continue
			}
		}
		kept = append(kept, list[i])
	}
	return kept, changed
}

// deviceClaim converts a claim's (or a template's claim's) devices.
func (c *converter) deviceClaim(d *doc, dc *resourceapi.DeviceClaim, p *field.Path) bool {
	changed := false
	for i := range dc.Requests {
		r := &dc.Requests[i]
		rp := p.Child("requests").Index(i)
		if e := r.Exactly; e != nil {
			changed = c.request(d, &e.DeviceClassName, e.Selectors, e.Tolerations, e.Capacity, rp.Child("exactly")) || changed
		}
		for j := range r.FirstAvailable {
			s := &r.FirstAvailable[j]
			changed = c.request(d, &s.DeviceClassName, s.Selectors, s.Tolerations, s.Capacity, rp.Child("firstAvailable").Index(j)) || changed
		}
	}
	for i := range dc.Constraints {
		m := dc.Constraints[i].MatchAttribute
		if m == nil {
			continue
		}
		to, ok, err := qualifiedAttribute(string(*m))
		if err != nil {
			c.problem(d, p.Child("constraints").Index(i).Child("matchAttribute"), err.Error())
		} else if ok {
			*m = resourceapi.FullyQualifiedName(to)
			changed = true
		}
	}
	var cfgChanged bool
	dc.Config, cfgChanged = configs(c, d, dc.Config, func(x *resourceapi.DeviceClaimConfiguration) *resourceapi.OpaqueDeviceConfiguration { return x.Opaque }, p.Child("config"))
	return cfgChanged || changed
}

// apply reports what became of an opaque config and puts the converted
// one in its place.
func (c *converter) apply(d *doc, res configResult, o *resourceapi.OpaqueDeviceConfiguration, p *field.Path) bool {
	at := func(f string) *field.Path {
		if f == "" {
			return p
		}
		q := p
		for _, part := range strings.Split(f, ".") {
			q = q.Child(part)
		}
		return q
	}
	for _, f := range res.problems {
		c.problem(d, at(f.field), f.why)
	}
	for _, f := range res.notes {
		c.note(d, at(f.field), f.why)
	}
	if res.opaque != nil {
		*o = *res.opaque
	}
	return res.changed
}

// request converts one request or subrequest.
func (c *converter) request(d *doc, class *string, sels []resourceapi.DeviceSelector, tols []resourceapi.DeviceToleration, capacity *resourceapi.CapacityRequirements, p *field.Path) bool {
	changed := false
	switch to, ok := classes[*class]; {
	case ok:
		*class, changed = to, true
	case computeDomainClasses[*class]:
		c.problem(d, p.Child("deviceClassName"), fmt.Sprintf("%s: %s", *class, computeDomainWhy))
	case strings.HasSuffix(*class, nvidiaDomainSuffix) && !c.classes[*class]:
		c.problem(d, p.Child("deviceClassName"), fmt.Sprintf("%s: not a class NVIDIA's chart installs that hwdra maps (%s), nor one the files given define", *class, strings.Join(sortedKeys(classes), ", ")))
	}
	changed = c.selectors(d, sels, p.Child("selectors")) || changed
	changed = c.tolerations(d, tols, p.Child("tolerations")) || changed
	if capacity != nil {
		for k := range capacity.Requests {
			if strings.HasPrefix(string(k), nvidiaDriver+"/") {
				c.problem(d, p.Child("capacity", "requests").Key(string(k)), "NVIDIA's GPUs offer no capacity to consume: hwdra's GPU shares do (share.gpu.hwdra.io, gpu.hwdra.io/memory and gpu.hwdra.io/compute)")
			}
		}
	}
	return changed
}

func (c *converter) selectors(d *doc, sels []resourceapi.DeviceSelector, p *field.Path) bool {
	changed := false
	for i := range sels {
		if sels[i].CEL == nil {
			continue
		}
		out, whys := rewriteCEL(sels[i].CEL.Expression)
		for _, why := range whys {
			c.problem(d, p.Index(i).Child("cel", "expression"), why)
		}
		if out != sels[i].CEL.Expression {
			sels[i].CEL.Expression, changed = out, true
		}
	}
	return changed
}

// tolerations maps tolerations of NVIDIA's device taints to hwdra's one
// key, gpu.hwdra.io/unhealthy, whose value is the reason: XID<n> for an
// XID, GPULost for a GPU off the bus.
func (c *converter) tolerations(d *doc, tols []resourceapi.DeviceToleration, p *field.Path) bool {
	changed := false
	for i := range tols {
		t := &tols[i]
		tp := p.Index(i).Child("key")
		switch t.Key {
		case nvidiaDriver + "/xid":
			t.Key = device.GPUTaintKey
			if t.Operator == resourceapi.DeviceTolerationOpEqual && t.Value != "" {
				t.Value = "XID" + t.Value
			} else {
				c.note(d, tp, "tolerates every gpu.hwdra.io/unhealthy taint, not only XIDs: hwdra has one key, the reason in its value")
			}
			changed = true
		case nvidiaDriver + "/gpu-lost":
			t.Key, t.Operator, t.Value, changed = device.GPUTaintKey, resourceapi.DeviceTolerationOpEqual, "GPULost", true
		default:
			if strings.HasPrefix(t.Key, nvidiaDriver+"/") {
				c.problem(d, tp, fmt.Sprintf("%s: hwdra has no such taint (it taints gpu.hwdra.io/unhealthy, the reason in the value)", t.Key))
			}
		}
	}
	return changed
}

// podSpecPaths: where the kinds that hold a pod template keep its spec.
var podSpecPaths = map[schema.GroupKind][]string{
	{Group: "", Kind: "Pod"}:                   {"spec"},
	{Group: "", Kind: "PodTemplate"}:           {"template", "spec"},
	{Group: "", Kind: "ReplicationController"}: {"spec", "template", "spec"},
	{Group: "apps", Kind: "Deployment"}:        {"spec", "template", "spec"},
	{Group: "apps", Kind: "ReplicaSet"}:        {"spec", "template", "spec"},
	{Group: "apps", Kind: "StatefulSet"}:       {"spec", "template", "spec"},
	{Group: "apps", Kind: "DaemonSet"}:         {"spec", "template", "spec"},
	{Group: "batch", Kind: "Job"}:              {"spec", "template", "spec"},
	{Group: "batch", Kind: "CronJob"}:          {"spec", "jobTemplate", "spec", "template", "spec"},
}

// pods reads a pod's (or a workload's pod template's) claims: nothing in
// a pod names NVIDIA's driver, but a claim template a ComputeDomain makes
// cannot work.
func (c *converter) pods(d *doc, gv schema.GroupVersion) {
	path, ok := podSpecPaths[gv.WithKind(d.head.Kind).GroupKind()]
	if !ok {
		return
	}
	var m map[string]any
	if json.Unmarshal(d.js, &m) != nil {
		return
	}
	raw, _ := json.Marshal(dig(m, path...))
	var spec corev1.PodSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		c.problem(d, field.NewPath(path[0], path[1:]...), "not a pod spec: "+err.Error())
		return
	}
	p := field.NewPath(path[0], path[1:]...)
	for i, rc := range spec.ResourceClaims {
		if t := rc.ResourceClaimTemplateName; t != nil && c.cdTemplates[d.head.Metadata.Namespace+"/"+*t] {
			c.problem(d, p.Child("resourceClaims").Index(i).Child("resourceClaimTemplateName"), fmt.Sprintf("%s is a ComputeDomain's channel template: %s", *t, computeDomainWhy))
		}
	}
	for i, ctr := range spec.Containers {
		for r := range ctr.Resources.Limits {
			if strings.HasPrefix(string(r), "nvidia.com/mig-") {
				c.note(d, p.Child("containers").Index(i).Child("resources", "limits").Key(string(r)),
					"hwdra serves it only where the operator offers the profile (chart value extendedResources.migProfiles)")
			}
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
