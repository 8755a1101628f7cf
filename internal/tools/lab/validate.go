// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package lab

import (
	"errors"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	apiservercel "k8s.io/apiserver/pkg/cel"
	"k8s.io/dynamic-resource-allocation/cel"
)

// validate checks a claim's spec.devices, after defaulting, by the rules
// kube-apiserver v1.37 applies to them (k8s.io/kubernetes
// pkg/apis/resource/validation, validateDeviceClaim), with the same field
// paths and messages: that package cannot be imported without the whole
// of k8s.io/kubernetes. What the API server checks beyond this
// (derived attributes) the allocator rejects in its own words; what it
// does not check (a capacity request's value) it does not check either:
// the lab then says what the allocator made of it. The real-node suite
// holds both to the same answers (TestLabValidatesAsTheAPIServer).
//
// The metadata is checked as for any object (apimachinery's
// ValidateObjectMeta: name a DNS subdomain, namespace a DNS label, labels,
// annotations); a template's own spec.metadata as a pod template's.
func validate(c *resourceapi.ResourceClaim, template *resourceapi.ResourceClaimTemplate) error {
	kind, spec := "ResourceClaim", field.NewPath("spec")
	errs := apimachineryvalidation.ValidateObjectMeta(&c.ObjectMeta, true, apimachineryvalidation.NameIsDNSSubdomain, field.NewPath("metadata"))
	if template != nil {
		kind, spec = "ResourceClaimTemplate", spec.Child("spec")
		meta := spec.Child("metadata")
		errs = append(errs, apimachineryvalidation.ValidateAnnotations(template.Spec.Annotations, meta.Child("annotations"))...)
		errs = append(errs, metav1validation.ValidateLabels(template.Spec.Labels, meta.Child("labels"))...)
	}
	d := c.Spec.Devices
	path := spec.Child("devices")
	names := map[string]sets.Set[string]{}
	for i, r := range d.Requests {
		p := path.Child("requests").Index(i)
		errs = append(errs, requestName(r.Name, p.Child("name"))...)
		if _, dup := names[r.Name]; dup {
			errs = append(errs, field.Duplicate(p.Child("name"), r.Name))
		}
		subs := sets.New[string]()
		names[r.Name] = subs
		switch {
		case r.Exactly == nil && len(r.FirstAvailable) == 0:
			errs = append(errs, field.Required(p, "exactly one of `exactly` or `firstAvailable` is required"))
		case r.Exactly != nil && len(r.FirstAvailable) > 0:
			errs = append(errs, field.Invalid(p, nil, "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set"))
		case r.Exactly != nil:
			e := r.Exactly
			errs = append(errs, deviceRequest(e.DeviceClassName, e.Selectors, e.AllocationMode, e.Count, e.Tolerations, p.Child("exactly"))...)
		default:
			if n := len(r.FirstAvailable); n > resourceapi.FirstAvailableDeviceRequestMaxSize {
				errs = append(errs, field.TooMany(p.Child("firstAvailable"), n, resourceapi.FirstAvailableDeviceRequestMaxSize))
			}
			for j, s := range r.FirstAvailable {
				sp := p.Child("firstAvailable").Index(j)
				errs = append(errs, requestName(s.Name, sp.Child("name"))...)
				if subs.Has(s.Name) {
					errs = append(errs, field.Duplicate(sp.Child("name"), s.Name))
				}
				subs.Insert(s.Name)
				errs = append(errs, deviceRequest(s.DeviceClassName, s.Selectors, s.AllocationMode, s.Count, s.Tolerations, sp)...)
			}
		}
	}
	if n := len(d.Requests); n > resourceapi.DeviceRequestsMaxSize {
		errs = append(errs, field.TooMany(path.Child("requests"), n, resourceapi.DeviceRequestsMaxSize))
	}
	for i, c := range d.Constraints {
		p := path.Child("constraints").Index(i)
		errs = append(errs, requestRefs(c.Requests, names, p.Child("requests"))...)
		switch {
		case c.MatchAttribute != nil:
			errs = append(errs, qualifiedName(string(*c.MatchAttribute), p.Child("matchAttribute"))...)
		case c.DistinctAttribute != nil:
			errs = append(errs, qualifiedName(string(*c.DistinctAttribute), p.Child("distinctAttribute"))...)
		default:
			errs = append(errs, field.Required(p, `exactly one of "matchAttribute" or "distinctAttribute" is required, but multiple fields are set`))
		}
	}
	for i, c := range d.Config {
		p := path.Child("config").Index(i)
		errs = append(errs, requestRefs(c.Requests, names, p.Child("requests"))...)
		switch {
		case c.Opaque == nil:
			errs = append(errs, field.Required(p.Child("opaque"), ""))
		case c.Opaque.Driver == "":
			errs = append(errs, field.Required(p.Child("opaque", "driver"), ""))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	lines := make([]string, len(errs))
	for i, e := range errs {
		lines[i] = e.Error()
	}
	return fmt.Errorf("%s %q is invalid:\n  %s", kind, c.Name, strings.Join(lines, "\n  "))
}

func requestName(name string, p *field.Path) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(p, "")}
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	return errs
}

func deviceRequest(class string, selectors []resourceapi.DeviceSelector, mode resourceapi.DeviceAllocationMode, count int64,
	tolerations []resourceapi.DeviceToleration, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if class == "" {
		errs = append(errs, field.Required(p.Child("deviceClassName"), ""))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(class) {
			errs = append(errs, field.Invalid(p.Child("deviceClassName"), class, msg))
		}
	}
	for i, s := range selectors {
		sp := p.Child("selectors").Index(i)
		if s.CEL == nil {
			errs = append(errs, field.Required(sp.Child("cel"), ""))
			continue
		}
		res := cel.GetCompiler(cel.Features{EnableConsumableCapacity: true}).CompileCELExpression(s.CEL.Expression, cel.Options{})
		if res.Error != nil {
			detail := res.Error.Error()
			var celErr *apiservercel.Error
			if errors.As(res.Error, &celErr) {
				detail = celErr.Detail
			}
			errs = append(errs, field.Invalid(sp.Child("cel", "expression"), s.CEL.Expression, detail))
		}
	}
	for i, t := range tolerations {
		errs = append(errs, toleration(t, p.Child("tolerations").Index(i))...)
	}
	switch mode {
	case resourceapi.DeviceAllocationModeAll:
		if count != 0 {
			errs = append(errs, field.Invalid(p.Child("count"), count, fmt.Sprintf("must not be specified when allocationMode is '%s'", mode)))
		}
	case resourceapi.DeviceAllocationModeExactCount:
		if count <= 0 {
			errs = append(errs, field.Invalid(p.Child("count"), count, "must be greater than zero"))
		}
	default:
		errs = append(errs, field.NotSupported(p.Child("allocationMode"), mode,
			[]resourceapi.DeviceAllocationMode{resourceapi.DeviceAllocationModeAll, resourceapi.DeviceAllocationModeExactCount}))
	}
	return errs
}

// toleration checks a device toleration: a label key, an operator, a
// label value only with Equal, a taint effect.
func toleration(t resourceapi.DeviceToleration, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if t.Key != "" {
		errs = append(errs, metav1validation.ValidateLabelName(t.Key, p.Child("key"))...)
	}
	switch t.Operator {
	case resourceapi.DeviceTolerationOpExists:
		if t.Value != "" {
			errs = append(errs, field.Invalid(p.Child("value"), t.Value, "must be empty for operator `Exists`"))
		}
	case resourceapi.DeviceTolerationOpEqual:
		for _, msg := range validation.IsValidLabelValue(t.Value) {
			errs = append(errs, field.Invalid(p.Child("value"), t.Value, msg))
		}
	case "":
		errs = append(errs, field.Required(p.Child("operator"), ""))
	default:
		errs = append(errs, field.NotSupported(p.Child("operator"), t.Operator,
			[]resourceapi.DeviceTolerationOperator{resourceapi.DeviceTolerationOpEqual, resourceapi.DeviceTolerationOpExists}))
	}
	switch t.Effect {
	case "", resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute, resourceapi.DeviceTaintEffectNone:
	default:
		errs = append(errs, field.NotSupported(p.Child("effect"), t.Effect,
			[]resourceapi.DeviceTaintEffect{resourceapi.DeviceTaintEffectNoExecute, resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNone}))
	}
	return errs
}

// requestRefs checks references to "request" or "request/subrequest".
func requestRefs(refs []string, names map[string]sets.Set[string], p *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := sets.New[string]()
	for i, ref := range refs {
		rp := p.Index(i)
		if seen.Has(ref) {
			errs = append(errs, field.Duplicate(rp, ref))
		}
		seen.Insert(ref)
		req, sub, hasSub := strings.Cut(ref, "/")
		subs, ok := names[req]
		if !ok || strings.Contains(sub, "/") || hasSub && !subs.Has(sub) {
			errs = append(errs, field.Invalid(rp, ref, "must be the name of a request in the claim or the name of a request and a subrequest separated by '/'"))
		}
	}
	return errs
}

func qualifiedName(name string, p *field.Path) field.ErrorList {
	domain, id, ok := strings.Cut(name, "/")
	if !ok {
		return field.ErrorList{field.Required(p, "a fully qualified name must be a domain and a name separated by a slash")}
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Subdomain(domain) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	if id == "" || len(id) > resourceapi.DeviceMaxIDLength {
		errs = append(errs, field.Invalid(p, name, fmt.Sprintf("the name after the domain must be 1 to %d characters", resourceapi.DeviceMaxIDLength)))
	}
	return errs
}
