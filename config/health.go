package config

import (
	"fmt"
	"slices"
)

// HealthConfig is the health section of the file.
type HealthConfig struct {
	// XIDs moves GPU XIDs in and out of the application XIDs, the ones
	// that are the running program's fault and not the device's.
	XIDs XIDConfig `json:"xids,omitempty"`
	// FatalEffect is the taint effect of fatal faults (a GPU lost, a reset
	// needed, uncorrectable memory errors): NoSchedule (default) keeps new
	// claims off the device, NoExecute also makes Kubernetes evict the
	// pods that use it. Other faults always taint NoSchedule.
	FatalEffect string `json:"fatalEffect,omitempty"`
}

// XIDConfig adds to and removes from the built-in application XIDs (13,
// 31, 43, 45, 68, 109).
type XIDConfig struct {
	// Ignore: XIDs that are no device failure on this node either.
	Ignore []uint64 `json:"ignore,omitempty"`
	// Report: XIDs that count as device failures even where they are
	// application XIDs by default.
	Report []uint64 `json:"report,omitempty"`
}

// Taint effects of fatal faults.
const (
	EffectNoSchedule = "NoSchedule"
	EffectNoExecute  = "NoExecute"
)

// HealthPolicy is the validated health section.
type HealthPolicy struct {
	IgnoreXIDs, ReportXIDs []uint64
	// FatalNoExecute: fatal faults taint NoExecute.
	FatalNoExecute bool
}

// HealthPolicy returns the validated health policy (the defaults without a
// health section).
func (c *AgentConfig) HealthPolicy() HealthPolicy { return c.health }

func compileHealth(h *HealthConfig) (HealthPolicy, []string) {
	var p HealthPolicy
	if h == nil {
		return p, nil
	}
	var problems []string
	for i, x := range h.XIDs.Report {
		if slices.Contains(h.XIDs.Ignore, x) {
			problems = append(problems, fmt.Sprintf("health.xids.report[%d]: XID %d is also in health.xids.ignore", i, x))
		}
	}
	switch h.FatalEffect {
	case "", EffectNoSchedule:
	case EffectNoExecute:
		p.FatalNoExecute = true
	default:
		problems = append(problems, fmt.Sprintf("health.fatalEffect: %q is not %s or %s", h.FatalEffect, EffectNoSchedule, EffectNoExecute))
	}
	p.IgnoreXIDs = slices.Clone(h.XIDs.Ignore)
	p.ReportXIDs = slices.Clone(h.XIDs.Report)
	return p, problems
}
