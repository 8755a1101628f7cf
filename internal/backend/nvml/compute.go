// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
)

// ComputeSizes are the compute-instance sizes (in compute slices) of a
// GPU instance profile: from NVML where an instance of the profile exists
// (NVML lists compute profiles only per GPU instance), else by the rule
// the hardware follows (`nvidia-smi mig -lcip`, MIG user guide): a 4-slice
// GPU instance offers 1, 2 and 4 but no 3; 7 slices 1, 2, 3, 4 and 7.
func ComputeSizes(p hw.MIGProfile) []int {
	if len(p.ComputeProfiles) > 0 {
		var out []int
		for _, c := range p.ComputeProfiles {
			out = append(out, c.Slices)
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	switch p.Slices {
	case 1:
		return []int{1}
	case 2:
		return []int{1, 2}
	case 3:
		return []int{1, 2, 3}
	case 4:
		return []int{1, 2, 4}
	case 7:
		return []int{1, 2, 3, 4, 7}
	}
	return []int{p.Slices}
}

// ComputeProfileSlices is the size of a compute instance profile
// (COMPUTE_INSTANCE_PROFILE_* index) from the inventory, or by NVML's
// naming of the constants where the inventory has none (0: unknown).
func ComputeProfileSlices(p hw.MIGProfile, profileID int) int {
	for _, c := range p.ComputeProfiles {
		if c.ID == profileID {
			return c.Slices
		}
	}
	return map[int]int{
		nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE: 1, nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
		nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE: 3, nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
		nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE: 7, nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE: 8,
		nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE: 6, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1: 1,
		nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL: 7,
	}[profileID]
}
