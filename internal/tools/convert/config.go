// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package convert

import (
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/api"
	gpuv1alpha1 "github.com/hwdra/hwdra/api/gpu/v1alpha1"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// nvConfig is the shape of NVIDIA's GpuConfig and MigDeviceConfig
// (resource.nvidia.com/v1beta1), as much as hwdra reads of it; decoded
// strictly, so a field it does not know is named, not lost.
type nvConfig struct {
	metav1.TypeMeta `json:",inline"`
	Sharing         *struct {
		Strategy          string `json:"strategy"`
		TimeSlicingConfig *struct {
			Interval *string `json:"interval,omitempty"`
		} `json:"timeSlicingConfig,omitempty"`
		MpsConfig *struct {
			DefaultActiveThreadPercentage     *int                         `json:"defaultActiveThreadPercentage,omitempty"`
			DefaultPinnedDeviceMemoryLimit    *resource.Quantity           `json:"defaultPinnedDeviceMemoryLimit,omitempty"`
			DefaultPerDevicePinnedMemoryLimit map[string]resource.Quantity `json:"defaultPerDevicePinnedMemoryLimit,omitempty"`
		} `json:"mpsConfig,omitempty"`
	} `json:"sharing,omitempty"`
}

// nvVfioConfig is NVIDIA's VfioDeviceConfig.
type nvVfioConfig struct {
	metav1.TypeMeta `json:",inline"`
	Iommu           *struct {
		BackendPolicy   string `json:"backendPolicy"`
		EnableAPIDevice *bool  `json:"enableAPIDevice,omitempty"`
	} `json:"iommu,omitempty"`
}

// configResult is what became of one opaque config: replaced, dropped
// (hwdra needs none), or kept as it was; with problems and notes, each
// with the field below the config it is about.
type configResult struct {
	opaque   *resourceapi.OpaqueDeviceConfiguration
	drop     bool
	changed  bool
	problems []finding
	notes    []finding
}

type finding struct{ field, why string }

// convertOpaque converts an opaque config for NVIDIA's drivers into
// hwdra's GpuConfig. Other drivers' configs are left alone.
func convertOpaque(o *resourceapi.OpaqueDeviceConfiguration) configResult {
	var res configResult
	switch o.Driver {
	case nvidiaCDDriver:
		res.problems = append(res.problems, finding{"driver", computeDomainWhy})
		return res
	case nvidiaDriver:
	default:
		return res
	}
	var head metav1.TypeMeta
	if err := json.Unmarshal(o.Parameters.Raw, &head); err != nil {
		res.problems = append(res.problems, finding{"parameters", "not an object: " + err.Error()})
		return res
	}
	if head.APIVersion != nvidiaConfigAPI {
		res.problems = append(res.problems, finding{"parameters.apiVersion", fmt.Sprintf("%q: hwdra convert reads %s", head.APIVersion, nvidiaConfigAPI)})
		return res
	}
	switch head.Kind {
	case "GpuConfig", "MigDeviceConfig":
		return convertSharing(o, head.Kind)
	case "VfioDeviceConfig":
		var c nvVfioConfig
		if err := yaml.UnmarshalStrict(o.Parameters.Raw, &c); err != nil {
			res.problems = append(res.problems, finding{"parameters", err.Error()})
			return res
		}
		if i := c.Iommu; i != nil && (i.BackendPolicy != "" && i.BackendPolicy != "LegacyOnly" || i.EnableAPIDevice != nil && *i.EnableAPIDevice) {
			res.problems = append(res.problems, finding{"parameters.iommu", "hwdra hands a passthrough GPU over as a legacy VFIO group (/dev/vfio/vfio and the group's node) only: no iommufd backend, no API device"})
			return res
		}
		// LegacyOnly without the API device is what hwdra's passthrough
		// devices always give: no config needed.
		res.drop, res.changed = true, true
		res.notes = append(res.notes, finding{"", "VfioDeviceConfig left out: hwdra's passthrough GPUs are legacy VFIO groups, which is what it asked for"})
		return res
	case "ComputeDomainChannelConfig", "ComputeDomainDaemonConfig":
		res.problems = append(res.problems, finding{"parameters.kind", computeDomainWhy})
		return res
	}
	res.problems = append(res.problems, finding{"parameters.kind", fmt.Sprintf("%q: not a kind of %s hwdra convert knows (GpuConfig, MigDeviceConfig, VfioDeviceConfig)", head.Kind, nvidiaConfigAPI)})
	return res
}

// convertSharing maps GpuConfig's and MigDeviceConfig's sharing to
// hwdra's GpuConfig sharing: the same strategies, the settings under
// other names (timeSlicingConfig is timeSlicing, mpsConfig is mps).
func convertSharing(o *resourceapi.OpaqueDeviceConfiguration, kind string) configResult {
	var res configResult
	var c nvConfig
	if err := yaml.UnmarshalStrict(o.Parameters.Raw, &c); err != nil {
		res.problems = append(res.problems, finding{"parameters", err.Error()})
		return res
	}
	out := gpuv1alpha1.GpuConfig{TypeMeta: metav1.TypeMeta{APIVersion: gpuv1alpha1.GroupVersion.String(), Kind: "GpuConfig"}}
	if s := c.Sharing; s != nil {
		switch s.Strategy {
		case "TimeSlicing":
			if kind == "MigDeviceConfig" {
				// NVIDIA sets no time slice on a MIG device either: its
				// processes take turns as on any device. hwdra refuses a
				// time slice on a partition (the slice is the GPU's).
				res.notes = append(res.notes, finding{"parameters.sharing", "TimeSlicing on a MIG device is what the device does without a setting: no sharing written"})
				break
			}
			out.Sharing = &gpuv1alpha1.Sharing{Strategy: gpuv1alpha1.TimeSlicing}
			if t := s.TimeSlicingConfig; t != nil && t.Interval != nil {
				out.Sharing.TimeSlicing = &gpuv1alpha1.TimeSlicingConfig{Interval: gpuv1alpha1.TimeSliceInterval(*t.Interval)}
			}
		case "MPS":
			out.Sharing = &gpuv1alpha1.Sharing{Strategy: gpuv1alpha1.MPS}
			if m := s.MpsConfig; m != nil {
				out.Sharing.MPS = &gpuv1alpha1.MPSConfig{DefaultActiveThreadPercentage: m.DefaultActiveThreadPercentage, DefaultPinnedDeviceMemoryLimit: m.DefaultPinnedDeviceMemoryLimit}
				if len(m.DefaultPerDevicePinnedMemoryLimit) > 0 {
					res.problems = append(res.problems, finding{"parameters.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit",
						"hwdra's MPS limit is one for every device of the claim (mps.defaultPinnedDeviceMemoryLimit): per-device limits are left out, set the one limit instead"})
				}
			}
		default:
			res.problems = append(res.problems, finding{"parameters.sharing.strategy", fmt.Sprintf("%q: want TimeSlicing or MPS", s.Strategy)})
			return res
		}
		if s.Strategy == "TimeSlicing" && s.MpsConfig != nil || s.Strategy == "MPS" && s.TimeSlicingConfig != nil {
			res.problems = append(res.problems, finding{"parameters.sharing", "settings of the other strategy: left out"})
		}
	}
	raw, err := json.Marshal(&out)
	if err != nil {
		res.problems = append(res.problems, finding{"parameters", err.Error()})
		return res
	}
	// hwdra's own decoder says whether the agent would take it (an
	// interval or percentage out of range).
	if _, err := api.Decode(raw); err != nil {
		res.problems = append(res.problems, finding{"parameters", "as hwdra's GpuConfig: " + err.Error()})
		return res
	}
	res.opaque = &resourceapi.OpaqueDeviceConfiguration{Driver: device.GPUDriver, Parameters: runtime.RawExtension{Raw: raw}}
	res.changed = true
	return res
}
