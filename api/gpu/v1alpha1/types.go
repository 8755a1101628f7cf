package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// GpuConfig configures GPU devices (full GPUs, MIG partitions, vGPUs).
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`
	// MIG applies to MIG partitions.
	MIG *MIGConfig `json:"mig,omitempty"`
}

// MIGConfig configures the compute instance created in a MIG partition.
type MIGConfig struct {
	// ComputeInstanceSlices is the size, in compute slices, of the compute
	// instance created in the GPU instance. Default: the whole instance.
	// It must be one of the GPU instance profile's compute profiles (for a
	// 3g partition: 1, 2 or 3).
	ComputeInstanceSlices *int `json:"computeInstanceSlices,omitempty"`
}

// Default fills in defaults. Nothing to default yet: an unset
// ComputeInstanceSlices means the whole GPU instance, which depends on the
// device and is resolved at prepare.
func (c *GpuConfig) Default() {}

// Validate checks the values that do not depend on the device.
func (c *GpuConfig) Validate() field.ErrorList {
	var errs field.ErrorList
	if c.MIG != nil && c.MIG.ComputeInstanceSlices != nil {
		if n := *c.MIG.ComputeInstanceSlices; n < 1 || n > 8 {
			errs = append(errs, field.Invalid(field.NewPath("mig", "computeInstanceSlices"), n, "must be between 1 and 8"))
		}
	}
	return errs
}
