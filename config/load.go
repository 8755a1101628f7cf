package config

import (
	"fmt"
	"os"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hwdra/hwdra/internal/strictyaml"
)

// Load reads and validates a configuration file. An empty path means no
// file: Default().
func Load(path string) (*AgentConfig, error) {
	if path == "" {
		return Default(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Default is the configuration without a file: every PF with VFs, shared,
// with DefaultBandwidth; default-route PFs stay out.
func Default() *AgentConfig {
	return &AgentConfig{
		APIVersion: APIVersion, Kind: Kind,
		rules: []rule{{index: -1, mode: ModeShared, bandwidth: DefaultBandwidth}},
	}
}

// Parse decodes, defaults and validates a file's content. Any error means
// no configuration: nothing is used from a half-valid file.
func Parse(data []byte) (*AgentConfig, error) {
	c := &AgentConfig{}
	if err := strictyaml.Decode(data, c); err != nil {
		return nil, err
	}
	var problems strictyaml.Problems
	if c.APIVersion != APIVersion {
		problems = append(problems, fmt.Sprintf("apiVersion: %q is not supported (use %s)", c.APIVersion, APIVersion))
	}
	if c.Kind != Kind {
		problems = append(problems, fmt.Sprintf("kind: %q is not %s", c.Kind, Kind))
	}
	for i, n := range c.NICs {
		r, errs := compileRule(n, fmt.Sprintf("nics[%d]", i))
		r.index = i
		problems = append(problems, errs...)
		c.rules = append(c.rules, r)
	}
	var hp []string
	c.health, hp = compileHealth(c.Health)
	problems = append(problems, hp...)
	if len(problems) > 0 {
		return nil, problems
	}
	return c, nil
}

// rule is a validated NICRule with normalised selector values.
type rule struct {
	index     int
	sel       PFSelector
	mode      Mode
	bandwidth BandwidthPolicy
}

func compileRule(n NICRule, path string) (rule, []string) {
	var problems []string
	add := func(field, format string, args ...any) {
		problems = append(problems, fmt.Sprintf("%s.%s: %s", path, field, fmt.Sprintf(format, args...)))
	}
	r := rule{mode: n.Mode, sel: n.Select}
	switch n.Mode {
	case "":
		r.mode = ModeShared
	case ModeShared, ModeExclusive, ModeDisabled:
	default:
		add("mode", "%q is not shared, exclusive or disabled", n.Mode)
	}
	r.sel.Names = normalise(n.Select.Names, "select.names", add, func(s string) (string, bool) {
		return s, s != "" && len(s) <= 15 && !strings.ContainsAny(s, "/: \t")
	}, "is not a netdev name")
	r.sel.PCIAddresses = normalise(n.Select.PCIAddresses, "select.pciAddresses", add, normalisePCIAddress,
		"is not a PCI address like 0000:17:00.0")
	r.sel.VendorIDs = normalise(n.Select.VendorIDs, "select.vendorIDs", add, normaliseID, `is not four hex digits like "15b3"`)
	r.sel.DeviceIDs = normalise(n.Select.DeviceIDs, "select.deviceIDs", add, normaliseID, `is not four hex digits like "1021"`)
	r.sel.Drivers = normalise(n.Select.Drivers, "select.drivers", add, func(s string) (string, bool) {
		return s, s != "" && !strings.ContainsAny(s, "/ \t")
	}, "is not a driver name")
	r.bandwidth = DefaultBandwidth
	if n.Bandwidth != nil {
		if r.mode != ModeShared {
			add("bandwidth", "only applies to mode shared")
		} else {
			r.bandwidth = compileBandwidth(*n.Bandwidth, add)
		}
	}
	return r, problems
}

func normalise(in []string, field string, add func(string, string, ...any), norm func(string) (string, bool), msg string) []string {
	out := make([]string, 0, len(in))
	for i, s := range in {
		n, ok := norm(s)
		if !ok {
			add(fmt.Sprintf("%s[%d]", field, i), "%q %s", s, msg)
			continue
		}
		out = append(out, n)
	}
	return out
}

var (
	pciAddressRE = regexp.MustCompile(`^([0-9a-f]{4}:)?[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$`)
	hexIDRE      = regexp.MustCompile(`^[0-9a-f]{4}$`)
)

func normalisePCIAddress(s string) (string, bool) {
	s = strings.ToLower(s)
	if !pciAddressRE.MatchString(s) {
		return s, false
	}
	if len(s) == len("17:00.0") {
		s = "0000:" + s
	}
	return s, true
}

func normaliseID(s string) (string, bool) {
	s = strings.TrimPrefix(strings.ToLower(s), "0x")
	return s, hexIDRE.MatchString(s)
}

// maxBandwidthMbps bounds values (100 Tb/s) far above any link, and far
// below where the arithmetic could overflow.
const maxBandwidthMbps = 100_000_000

// compileBandwidth parses, defaults and checks a policy; see the package
// documentation for the defaulting rules.
func compileBandwidth(b Bandwidth, add func(string, string, ...any)) BandwidthPolicy {
	parse := func(field, s string) (int, bool) {
		if s == "" {
			return 0, false
		}
		q, err := resource.ParseQuantity(s)
		switch {
		case err != nil:
			add("bandwidth."+field, "%q is not a quantity in bits per second, like 10G", s)
		case q.Sign() <= 0:
			add("bandwidth."+field, "must be > 0")
		case q.Cmp(*resource.NewScaledQuantity(maxBandwidthMbps, resource.Mega)) > 0:
			add("bandwidth."+field, "%s is above 100T", s)
		case q.Value()%1_000_000 != 0 || q.Value() == 0:
			add("bandwidth."+field, "%s must be a whole number of Mb/s (a multiple of 1M; Gi, Mi are binary, not bit rates)", s)
		default:
			return int(q.Value() / 1_000_000), true
		}
		return 0, false
	}
	p := DefaultBandwidth
	minimum, haveMin := parse("minimum", b.Minimum)
	step, haveStep := parse("step", b.Step)
	def, haveDef := parse("default", b.Default)
	switch {
	case haveMin && haveStep:
		p.MinimumMbps, p.StepMbps = minimum, step
	case haveMin:
		p.MinimumMbps, p.StepMbps = minimum, minimum
	case haveStep:
		p.MinimumMbps, p.StepMbps = step, step
	}
	if !haveDef {
		// Round the built-in default up to the first valid share.
		k := max(0, (DefaultShareMbps-p.MinimumMbps+p.StepMbps-1)/p.StepMbps)
		p.DefaultMbps = p.MinimumMbps + k*p.StepMbps
		return p
	}
	switch {
	case def < p.MinimumMbps:
		add("bandwidth.default", "%s is below the minimum (%s)", b.Default, mbps(p.MinimumMbps))
	case (def-p.MinimumMbps)%p.StepMbps != 0:
		add("bandwidth.default", "%s is not the minimum (%s) plus a multiple of the step (%s)", b.Default, mbps(p.MinimumMbps), mbps(p.StepMbps))
	}
	p.DefaultMbps = def
	return p
}

// mbps formats Mb/s as a bit-rate quantity ("10G").
func mbps(v int) string {
	return resource.NewScaledQuantity(int64(v), resource.Mega).String()
}
