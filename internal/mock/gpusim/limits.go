// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"strings"

	"github.com/hwdra/hwdra/internal/mock/model"
)

// MaxPerGPU is, for each MIG profile and vGPU type the models know, the
// most partitions of it one GPU holds (NVML's instance count of the
// profile, the type's max instances), the largest across the models that
// share a name. The chart's claim-limits policy refuses claims for more
// than this times the most GPUs a node has (deploy/helm/hwdra/files/
// per-gpu-limits.json, kept equal to this by TestChartPerGPULimits).
func MaxPerGPU() map[string]int {
	out := map[string]int{}
	put := func(name string, n int) {
		if n > out[name] {
			out[name] = n
		}
	}
	for _, name := range model.GPUNames() {
		m, _ := model.LookupGPU(name)
		for _, p := range m.Profiles {
			put(p.Name, p.Count)
		}
		for _, t := range defaultVGPUTypes(m) {
			// Published as the type's name without the vendor.
			put(strings.TrimPrefix(t.Name, "NVIDIA "), t.MaxInstances)
		}
	}
	return out
}
