// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"slices"

	configv1alpha1 "github.com/hwdra/hwdra/api/config/v1alpha1"
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

func healthPolicy(h *configv1alpha1.HealthConfig) HealthPolicy {
	if h == nil {
		return HealthPolicy{}
	}
	return HealthPolicy{
		IgnoreXIDs:     slices.Clone(h.XIDs.Ignore),
		ReportXIDs:     slices.Clone(h.XIDs.Report),
		FatalNoExecute: h.FatalEffect == configv1alpha1.EffectNoExecute,
	}
}
