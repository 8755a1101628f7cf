// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// GpuConfig configures GPU devices (full GPUs, MIG partitions, vGPUs,
// GPU shares).
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`
	// MIG applies to MIG partitions.
	MIG *MIGConfig `json:"mig,omitempty"`
	// Sharing says how the processes of the pods and containers that use
	// one claim's devices share them: each GPU or MIG partition by time
	// slices or under an MPS server. Unset: as the driver leaves a device,
	// time-sliced at the GPU's current interval. vGPUs take no sharing
	// (their VM has the device), and GPU shares none of their own (each
	// runs under MPS, held to the memory and compute the scheduler
	// counted; Share says under which daemon).
	Sharing *Sharing `json:"sharing,omitempty"`
	// Share configures a GPU share (a device of type share, claimed with
	// the capacities gpu.hwdra.io/memory and gpu.hwdra.io/compute): how
	// it is held to what the scheduler counted. Only a share takes it.
	// Unset: Policed.
	Share *ShareConfig `json:"share,omitempty"`
}

// ShareIsolation is how a GPU share is held to its memory and compute.
type ShareIsolation string

const (
	// Policed: the share runs under its GPU's one MPS daemon, beside the
	// GPU's other policed shares, its processes given the share's limits
	// in their environment (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
	// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT). A process can raise those by
	// rewriting its environment (measured on an H200: all 132 SMs and
	// 48 GiB for a share of 40% and 20 GiB), so the agent polices the
	// share from outside. The shares' kernels run at once: the cheaper
	// kind.
	Policed ShareIsolation = "Policed"
	// Dedicated: the share runs under an MPS daemon of its own whose
	// defaults are the share's limits: ceilings a process cannot raise
	// from its environment (measured on an H200: a client that set its
	// own 100% and 100000M got 66 of 132 SMs and 16 GiB under a daemon
	// with defaults 50% and 16 GiB). The price, measured on the H200:
	// the servers of two daemons on one GPU take turns instead of
	// running at once (two shares of 40% and 30% computed 547 TFLOP/s
	// together under one daemon, 307 under two daemons: -44%), and the
	// GPU must be in compute mode Default while a dedicated share is on
	// it (two MPS servers cannot both hold a context in
	// ExclusiveProcess), where a process that bypasses MPS gets a context
	// of its own on the whole GPU; the agent's policing watches for such
	// processes.
	Dedicated ShareIsolation = "Dedicated"
)

// ShareIsolations are the isolations a share takes.
var ShareIsolations = []ShareIsolation{Policed, Dedicated}

// ShareConfig configures a GPU share.
type ShareConfig struct {
	// Isolation is Policed (default) or Dedicated.
	Isolation ShareIsolation `json:"isolation,omitempty"`
}

// MIGConfig configures the compute instance created in a MIG partition.
type MIGConfig struct {
	// ComputeInstanceSlices is the size, in compute slices, of the compute
	// instance created in the GPU instance. Default: the whole instance.
	// It must be one of the GPU instance profile's compute profiles (for a
	// 3g partition: 1, 2 or 3).
	ComputeInstanceSlices *int `json:"computeInstanceSlices,omitempty"`
}

// SharingStrategy is how a claim's processes share its devices.
type SharingStrategy string

const (
	// TimeSlicing: processes take turns on the whole GPU, each for the
	// time slice TimeSlicing.Interval sets. Whole GPUs only: the time
	// slice is a setting of the physical GPU.
	TimeSlicing SharingStrategy = "TimeSlicing"
	// MPS: processes run at once under one CUDA MPS server per claim,
	// each held to the limits MPS sets. Whole GPUs and MIG partitions.
	MPS SharingStrategy = "MPS"
)

// Sharing is one of the strategies with its settings.
type Sharing struct {
	// Strategy is TimeSlicing or MPS.
	Strategy SharingStrategy `json:"strategy"`
	// TimeSlicing is TimeSlicing's setting (only with that strategy).
	TimeSlicing *TimeSlicingConfig `json:"timeSlicing,omitempty"`
	// MPS is MPS's settings (only with that strategy).
	MPS *MPSConfig `json:"mps,omitempty"`
}

// TimeSliceInterval names the compute time slices the driver offers
// (`nvidia-smi compute-policy --set-timeslice`).
type TimeSliceInterval string

const (
	IntervalDefault TimeSliceInterval = "Default"
	IntervalShort   TimeSliceInterval = "Short"
	IntervalMedium  TimeSliceInterval = "Medium"
	IntervalLong    TimeSliceInterval = "Long"
)

// Intervals are the intervals in the driver's order: the index is the
// value nvidia-smi takes (0 Default, 1 Short, 2 Medium, 3 Long).
var Intervals = []TimeSliceInterval{IntervalDefault, IntervalShort, IntervalMedium, IntervalLong}

// TimeSlicingConfig is the time slice of a time-sliced GPU.
type TimeSlicingConfig struct {
	// Interval is the GPU's compute time slice while the claim is
	// prepared. Default: Default.
	Interval TimeSliceInterval `json:"interval,omitempty"`
}

// MPSConfig are the defaults the claim's MPS control daemon gives every
// client, which the containers also get in their environment.
type MPSConfig struct {
	// DefaultActiveThreadPercentage caps the share of each GPU's
	// multiprocessors one client may use, 1 to 100. Unset: no cap.
	DefaultActiveThreadPercentage *int `json:"defaultActiveThreadPercentage,omitempty"`
	// DefaultPinnedDeviceMemoryLimit caps the device memory one client
	// may allocate on each GPU ("10Gi"), at least 1Mi. Unset: no cap.
	DefaultPinnedDeviceMemoryLimit *resource.Quantity `json:"defaultPinnedDeviceMemoryLimit,omitempty"`
}

// Default fills in defaults. An unset ComputeInstanceSlices means the
// whole GPU instance, which depends on the device and is resolved at
// prepare; a time-sliced claim without an interval gets Default; a
// share without an isolation Policed.
func (c *GpuConfig) Default() {
	if c.Share != nil && c.Share.Isolation == "" {
		c.Share.Isolation = Policed
	}
	if s := c.Sharing; s != nil && s.Strategy == TimeSlicing {
		if s.TimeSlicing == nil {
			s.TimeSlicing = &TimeSlicingConfig{}
		}
		if s.TimeSlicing.Interval == "" {
			s.TimeSlicing.Interval = IntervalDefault
		}
	}
}

// Validate checks the values that do not depend on the device.
func (c *GpuConfig) Validate() field.ErrorList {
	var errs field.ErrorList
	if c.MIG != nil && c.MIG.ComputeInstanceSlices != nil {
		if n := *c.MIG.ComputeInstanceSlices; n < 1 || n > 8 {
			errs = append(errs, field.Invalid(field.NewPath("mig", "computeInstanceSlices"), n, "must be between 1 and 8"))
		}
	}
	if c.Sharing != nil {
		errs = append(errs, c.Sharing.validate(field.NewPath("sharing"))...)
	}
	if c.Share != nil && !slices.Contains(ShareIsolations, c.Share.Isolation) {
		errs = append(errs, field.NotSupported(field.NewPath("share", "isolation"), c.Share.Isolation, ShareIsolations))
	}
	return errs
}

// minPinnedLimit is the smallest pinned memory limit MPS takes: it is
// given in whole megabytes.
var minPinnedLimit = resource.MustParse("1Mi")

func (s *Sharing) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch s.Strategy {
	case TimeSlicing:
		if s.MPS != nil {
			errs = append(errs, field.Forbidden(p.Child("mps"), "only with strategy MPS"))
		}
		if t := s.TimeSlicing; t != nil && t.Interval.Index() < 0 {
			errs = append(errs, field.NotSupported(p.Child("timeSlicing", "interval"), t.Interval, Intervals))
		}
	case MPS:
		if s.TimeSlicing != nil {
			errs = append(errs, field.Forbidden(p.Child("timeSlicing"), "only with strategy TimeSlicing"))
		}
		if m := s.MPS; m != nil {
			if v := m.DefaultActiveThreadPercentage; v != nil && (*v < 1 || *v > 100) {
				errs = append(errs, field.Invalid(p.Child("mps", "defaultActiveThreadPercentage"), *v, "must be between 1 and 100"))
			}
			if v := m.DefaultPinnedDeviceMemoryLimit; v != nil && v.Cmp(minPinnedLimit) < 0 {
				errs = append(errs, field.Invalid(p.Child("mps", "defaultPinnedDeviceMemoryLimit"), v.String(), "must be at least 1Mi"))
			}
		}
	case "":
		errs = append(errs, field.Required(p.Child("strategy"), "TimeSlicing or MPS"))
	default:
		errs = append(errs, field.NotSupported(p.Child("strategy"), s.Strategy, []SharingStrategy{TimeSlicing, MPS}))
	}
	return errs
}

// Index is the interval's value for nvidia-smi (0 to 3), -1 if unknown.
func (i TimeSliceInterval) Index() int { return slices.Index(Intervals, i) }
