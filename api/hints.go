// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"fmt"

	gpuv1alpha1 "github.com/hwdra/hwdra/api/gpu/v1alpha1"
	sriovv1alpha1 "github.com/hwdra/hwdra/api/sriov/v1alpha1"
)

// Drivers are hwdra's drivers, named as their opaque configs' groups.
var Drivers = []string{gpuv1alpha1.GroupVersion.Group, sriovv1alpha1.GroupVersion.Group}

// nvidiaConfigGroup is the API group of NVIDIA's GPU DRA driver's opaque
// configs (GpuConfig, MigDeviceConfig, ... of resource.nvidia.com), and
// nvidiaDriver its driver name.
const (
	nvidiaConfigGroup = "resource.nvidia.com"
	nvidiaDriver      = "gpu.nvidia.com"
)

// convertHint points manifests written for NVIDIA's driver at the tool
// that rewrites them.
const convertHint = "written for NVIDIA's GPU DRA driver: `hwdra convert` rewrites such manifests for hwdra"

// DriverHint says what a driver name that is not hwdra's likely means:
// NVIDIA's driver, or a near miss of one of hwdra's (a typo such as
// gpu.hwdra.com); "" for anything else.
func DriverHint(driver string) string {
	if driver == nvidiaDriver {
		return convertHint
	}
	for _, d := range Drivers {
		if driver != d && editDistance(driver, d) <= 3 {
			return fmt.Sprintf("did you mean %s?", d)
		}
	}
	return ""
}

// editDistance is the Levenshtein distance of two short names.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
