// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Validate checks a defaulted configuration and reports every problem
// with its field path ("nics[1].bandwidth.step").
func (c *AgentConfig) Validate() field.ErrorList {
	var errs field.ErrorList
	if c.NICs != nil && len(c.NICs) == 0 {
		// Left out, nics keeps its default; an empty list would offer no
		// PF at all, which is too easy to write by mistake to take.
		errs = append(errs, field.Invalid(field.NewPath("nics"), field.OmitValueType{},
			"an empty list would offer no PF: leave nics out to offer every PF with VFs in shared mode, or write [{mode: disabled}] to offer none"))
	}
	for i := range c.NICs {
		errs = append(errs, c.NICs[i].validate(field.NewPath("nics").Index(i))...)
	}
	if c.Health != nil {
		errs = append(errs, c.Health.validate(field.NewPath("health"))...)
	}
	if c.GPUs != nil {
		errs = append(errs, c.GPUs.validate(field.NewPath("gpus"))...)
	}
	if c.DevicePlugin != nil {
		errs = append(errs, c.DevicePlugin.validate(field.NewPath("devicePlugin"))...)
	}
	if c.VFPolicy != nil {
		errs = append(errs, c.VFPolicy.validate(field.NewPath("vfPolicy"))...)
	}
	return errs
}

func (v *VFPolicy) validate(p *field.Path) field.ErrorList {
	errs := v.VFClaimSettings.validate(p)
	for i := range v.PFs {
		rp := p.Child("pfs").Index(i)
		errs = append(errs, v.PFs[i].Select.validate(rp.Child("select"))...)
		errs = append(errs, v.PFs[i].VFClaimSettings.validate(rp)...)
	}
	return errs
}

func (s *VFClaimSettings) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, r := range s.AllowedVLANs {
		if _, _, err := r.Bounds(); err != nil {
			errs = append(errs, field.Invalid(p.Child("allowedVLANs").Index(i), string(r), err.Error()))
		}
	}
	return errs
}

// MaxVLAN is the highest VLAN ID (4095 is reserved).
const MaxVLAN = 4094

// Bounds reads the range: lo == hi for a single VLAN. The error says what
// is wrong with it.
func (r VLANRange) Bounds() (lo, hi int, err error) {
	a, b, isRange := strings.Cut(string(r), "-")
	lo, err1 := strconv.Atoi(a)
	hi, err2 := lo, error(nil)
	if isRange {
		hi, err2 = strconv.Atoi(b)
	}
	const form = `must be a VLAN ID (0 to 4094) or a range of them like "200-299"`
	switch {
	case err1 != nil || err2 != nil || strings.HasPrefix(a, "+") || strings.HasPrefix(b, "+"):
		return 0, 0, errors.New(form)
	case lo < 0 || hi > MaxVLAN:
		return 0, 0, errors.New(form)
	case lo > hi:
		return 0, 0, errors.New("must be a range from the lower VLAN ID to the higher")
	}
	return lo, hi, nil
}

func (g *GPUConfig) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if g.MIGProfiles != nil {
		errs = append(errs, g.MIGProfiles.validate(p.Child("migProfiles"))...)
	}
	switch g.Settings {
	case GPUSettingsManage, GPUSettingsLeave:
	default:
		errs = append(errs, field.NotSupported(p.Child("settings"), g.Settings, []GPUSettings{GPUSettingsManage, GPUSettingsLeave}))
	}
	switch g.ClaimStatus {
	case GPUClaimStatusWrite, GPUClaimStatusOff:
	default:
		errs = append(errs, field.NotSupported(p.Child("claimStatus"), g.ClaimStatus, []GPUClaimStatus{GPUClaimStatusWrite, GPUClaimStatusOff}))
	}
	if s := g.Shares; s != nil {
		sp := p.Child("shares")
		switch s.Overuse {
		case ShareOveruseStop, ShareOveruseReport:
		default:
			errs = append(errs, field.NotSupported(sp.Child("overuse"), s.Overuse, []ShareOveruse{ShareOveruseStop, ShareOveruseReport}))
		}
		if ms := s.CheckIntervalMilliseconds; ms != nil && (*ms < 100 || *ms > 60000) {
			errs = append(errs, field.Invalid(sp.Child("checkIntervalMilliseconds"), *ms, "must be 100 to 60000"))
		}
	}
	if m := g.MPS; m != nil {
		mp := p.Child("mps")
		if _, err := Bytes(m.ShmSize, 1<<20, 1<<40); err != nil {
			errs = append(errs, field.Invalid(mp.Child("shmSize"), string(m.ShmSize), err.Error()))
		}
		if _, err := Bytes(m.DaemonMemoryLimit, 64<<20, 1<<50); err != nil {
			errs = append(errs, field.Invalid(mp.Child("daemonMemoryLimit"), string(m.DaemonMemoryLimit), err.Error()))
		}
	}
	return errs
}

// Bytes reads a size (a quantity of bytes, "1Gi") that must be from
// minimum to maximum bytes. The error says what is wrong with it.
func Bytes(s Quantity, minimum, maximum int64) (int64, error) {
	q, err := resource.ParseQuantity(string(s))
	switch {
	case err != nil:
		return 0, errors.New(`must be a quantity of bytes, like "1Gi"`)
	case q.Cmp(*resource.NewQuantity(minimum, resource.BinarySI)) < 0:
		return 0, fmt.Errorf("must be at least %s", resource.NewQuantity(minimum, resource.BinarySI))
	case q.Cmp(*resource.NewQuantity(maximum, resource.BinarySI)) > 0:
		return 0, fmt.Errorf("must be at most %s", resource.NewQuantity(maximum, resource.BinarySI))
	}
	return q.Value(), nil
}

// profilePatternRE: what MIG profile names are made of (lower-case
// letters, digits, '.', '+', '-'), and the wildcards * and ?.
var profilePatternRE = regexp.MustCompile(`^[a-z0-9.+*?-]+$`)

func (f *ProfileFilter) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, l := range []struct {
		name     string
		patterns []string
	}{{"include", f.Include}, {"exclude", f.Exclude}} {
		for i, pat := range l.patterns {
			if !profilePatternRE.MatchString(pat) {
				errs = append(errs, field.Invalid(p.Child(l.name).Index(i), pat,
					`must be a MIG profile name like "1g.10gb+me" or a pattern like "*+me*": lower-case letters, digits, '.', '+', '-', and the wildcards * and ?`))
			}
		}
	}
	return errs
}

// Offers reports whether the filter offers the named profile. Patterns
// are valid (Validate).
func (f *ProfileFilter) Offers(name string) bool {
	if f == nil {
		return true
	}
	match := func(patterns []string) bool {
		return slices.ContainsFunc(patterns, func(p string) bool { ok, _ := path.Match(p, name); return ok })
	}
	return (len(f.Include) == 0 || match(f.Include)) && !match(f.Exclude)
}

var (
	pciAddressRE = regexp.MustCompile(`^([0-9a-f]{4}:)?[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$`)
	hexIDRE      = regexp.MustCompile(`^[0-9a-f]{4}$`)
	gpuUUIDRE    = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

func (r *NICRule) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch r.Mode {
	case ModeShared, ModeExclusive, ModeDisabled:
	default:
		errs = append(errs, field.NotSupported(p.Child("mode"), r.Mode, []Mode{ModeShared, ModeExclusive, ModeDisabled}))
	}
	errs = append(errs, r.Select.validate(p.Child("select"))...)
	if r.Bandwidth != nil {
		if r.Mode != ModeShared {
			errs = append(errs, field.Forbidden(p.Child("bandwidth"), "only applies to mode shared"))
		} else {
			errs = append(errs, r.Bandwidth.validate(p.Child("bandwidth"))...)
		}
	}
	return errs
}

// validate checks each value of the selector.
func (s *PFSelector) validate(sel *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, l := range []struct {
		name   string
		values []string
		ok     func(string) bool
		detail string
	}{
		{"names", s.Names, func(s string) bool { return s != "" && len(s) <= 15 && !strings.ContainsAny(s, "/: \t") },
			"must be a netdev name: 1 to 15 bytes, no '/', ':' or blanks"},
		{"pciAddresses", s.PCIAddresses, pciAddressRE.MatchString, "must be a PCI address like 0000:17:00.0"},
		{"vendorIDs", s.VendorIDs, hexIDRE.MatchString, `must be four hex digits like "15b3"`},
		{"deviceIDs", s.DeviceIDs, hexIDRE.MatchString, `must be four hex digits like "1021"`},
		{"drivers", s.Drivers, func(s string) bool { return s != "" && !strings.ContainsAny(s, "/ \t") },
			"must be a kernel driver name"},
	} {
		for i, v := range l.values {
			if !l.ok(v) {
				errs = append(errs, field.Invalid(sel.Child(l.name).Index(i), v, l.detail))
			}
		}
	}
	return errs
}

// validate checks each value and, where all three are valid, that the
// default is one of the valid shares.
func (b *Bandwidth) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	values := map[string]int{}
	for _, f := range []struct {
		name  string
		value Quantity
	}{{"default", b.Default}, {"minimum", b.Minimum}, {"step", b.Step}} {
		if f.value == "" {
			continue // left empty by defaulting where another value is invalid
		}
		v, err := Mbps(f.value)
		if err != nil {
			errs = append(errs, field.Invalid(p.Child(f.name), string(f.value), err.Error()))
			continue
		}
		values[f.name] = v
	}
	if len(values) < 3 {
		return errs
	}
	def, minimum, step := values["default"], values["minimum"], values["step"]
	switch {
	case def < minimum:
		errs = append(errs, field.Invalid(p.Child("default"), string(b.Default), fmt.Sprintf("must be at least the minimum (%s)", FormatMbps(minimum))))
	case (def-minimum)%step != 0:
		errs = append(errs, field.Invalid(p.Child("default"), string(b.Default),
			fmt.Sprintf("must be the minimum (%s) plus a multiple of the step (%s)", FormatMbps(minimum), FormatMbps(step))))
	}
	return errs
}

func (h *HealthConfig) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, x := range h.XIDs.Report {
		if slices.Contains(h.XIDs.Ignore, x) {
			errs = append(errs, field.Invalid(p.Child("xids", "report").Index(i), x, "is also in health.xids.ignore"))
		}
	}
	switch h.FatalEffect {
	case EffectNoSchedule, EffectNoExecute:
	default:
		errs = append(errs, field.NotSupported(p.Child("fatalEffect"), h.FatalEffect, []string{EffectNoSchedule, EffectNoExecute}))
	}
	return errs
}

func (d *DevicePluginConfig) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, r := range d.Resources {
		if err := resourcePattern(r); err != nil {
			errs = append(errs, field.Invalid(p.Child("resources").Index(i), r, err.Error()))
		}
	}
	if g := d.OwnedGPUs; g != nil {
		sel := p.Child("ownedGPUs")
		for i, a := range g.PCIAddresses {
			if !pciAddressRE.MatchString(a) {
				errs = append(errs, field.Invalid(sel.Child("pciAddresses").Index(i), a, "must be a PCI address like 0000:1b:00.0"))
			}
		}
		for i, u := range g.UUIDs {
			if !gpuUUIDRE.MatchString(u) {
				errs = append(errs, field.Invalid(sel.Child("uuids").Index(i), u, "must be a GPU UUID as NVML reports it, like GPU-3ae1f2c4-0b6d-4e1a-9c2f-5d7e8f901234"))
			}
		}
	}
	return errs
}

// resourcePattern checks an extended resource name, or a prefix of one
// ending in "*".
func resourcePattern(s string) error {
	name, prefix := strings.CutSuffix(s, "*")
	if strings.Contains(name, "*") {
		return errors.New(`"*" may only end a prefix`)
	}
	if prefix {
		// Any name the prefix starts is to be valid: test the shortest.
		name += "x"
	}
	return extendedResourceName(name)
}

// extendedResourceName checks a name as the API server checks extended
// resource names (k8s.io/kubernetes pkg/apis/core/v1/helper
// IsExtendedResourceName, which apiserver validation and the scheduler
// use): a domain-prefixed name outside kubernetes.io, that prefixed with
// "requests." is a qualified name.
func extendedResourceName(s string) error {
	switch {
	case !strings.Contains(s, "/"):
		return errors.New("must be a domain-prefixed name like nvidia.com/gpu")
	case strings.Contains(s, "kubernetes.io/"):
		return errors.New("must not be in the kubernetes.io domain")
	case strings.HasPrefix(s, "requests."):
		return errors.New(`must not start with "requests."`)
	}
	if msgs := validation.IsQualifiedName("requests." + s); len(msgs) > 0 {
		return errors.New("must be an extended resource name like nvidia.com/gpu: " + strings.Join(msgs, "; "))
	}
	return nil
}

// maxBandwidthMbps bounds values (100 Tb/s) far above any link, and far
// below where the arithmetic could overflow.
const maxBandwidthMbps = 100_000_000

// Mbps reads a bandwidth value (a quantity in bits per second, "10G") in
// Mb/s, the VF rate limit's unit. The error says what is wrong with it.
func Mbps(s Quantity) (int, error) {
	q, err := resource.ParseQuantity(string(s))
	switch {
	case err != nil:
		return 0, errors.New("must be a quantity in bits per second, like 10G")
	case q.Sign() <= 0:
		return 0, errors.New("must be > 0")
	case q.Cmp(*resource.NewScaledQuantity(maxBandwidthMbps, resource.Mega)) > 0:
		return 0, errors.New("must be at most 100T")
	case q.Value()%1_000_000 != 0 || q.Value() == 0:
		return 0, errors.New("must be a whole number of Mb/s (a multiple of 1M; Gi, Mi are binary, not bit rates)")
	}
	return int(q.Value() / 1_000_000), nil
}

// FormatMbps writes Mb/s as a bit-rate quantity ("10G").
func FormatMbps(v int) Quantity {
	return Quantity(resource.NewScaledQuantity(int64(v), resource.Mega).String())
}
