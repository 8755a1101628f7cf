// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package profile

import (
	"fmt"
	"reflect"
	"strings"
	"time"
)

// Duration is a Go duration string in a profile ("3s", "500ms").
type Duration string

// Parse is the duration; "" is none.
func (d Duration) Parse() (time.Duration, error) {
	if d == "" {
		return 0, nil
	}
	v, err := time.ParseDuration(string(d))
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a duration like 3s or 500ms", string(d))
	}
	return v, nil
}

// GPUTimings say how long the GPU calls of a group take (unset: no time at
// all). The change a call makes happens, and is saved (HWDRA_MOCK_DIR),
// when the call starts; then the call blocks for its duration before it
// returns, as a driver ioctl that a signal cannot interrupt: a process
// killed meanwhile leaves the change made but never learns its result
// (a GPU instance's ID, ...). While it blocks, the mock's directory holds a
// marker busy/<call>.<n> naming the call and the device (ReadState reports
// them as Busy), so a test can wait for it and then kill the caller.
type GPUTimings struct {
	// NVML calls: nvmlDeviceCreateGpuInstance(WithPlacement),
	// nvmlGpuInstanceDestroy, nvmlGpuInstanceCreateComputeInstance(...),
	// nvmlComputeInstanceDestroy, nvmlDeviceSetMigMode.
	CreateGpuInstance      Duration `json:"createGpuInstance,omitempty"`
	DestroyGpuInstance     Duration `json:"destroyGpuInstance,omitempty"`
	CreateComputeInstance  Duration `json:"createComputeInstance,omitempty"`
	DestroyComputeInstance Duration `json:"destroyComputeInstance,omitempty"`
	SetMigMode             Duration `json:"setMigMode,omitempty"`
	// Writes to mdev_supported_types/<type>/create and <mdev>/remove.
	CreateMdev Duration `json:"createMdev,omitempty"`
	RemoveMdev Duration `json:"removeMdev,omitempty"`
	// Writes to a VF's nvidia/current_vgpu_type (the vendor-specific
	// VFIO framework), a type ID or 0.
	SetVGPUType Duration `json:"setVgpuType,omitempty"`
}

// NICTimings say how long the VF calls on a group's PFs take, with the
// same meaning as GPUTimings.
type NICTimings struct {
	// SetVF is one VF configuration (hw.VFConfigurator.SetVF: the netlink
	// requests that set MAC, VLAN, rate, trust, spoof check, MTU, state).
	SetVF Duration `json:"setVF,omitempty"`
}

// timingMap is the set fields of a GPUTimings or NICTimings (a pointer,
// maybe nil) by call name.
func timingMap(t any) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	v := reflect.ValueOf(t)
	if v.IsNil() {
		return out, nil
	}
	v = v.Elem()
	for i := range v.NumField() {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		d, err := v.Field(i).Interface().(Duration).Parse()
		if err != nil {
			return nil, fmt.Errorf("timings.%s: %w", name, err)
		}
		if d > 0 {
			out[name] = d
		}
	}
	return out, nil
}

// Durations are the set timings by call name (nil: none). An error names
// the field.
func (t *GPUTimings) Durations() (map[string]time.Duration, error) { return timingMap(t) }

// Durations are the set timings by call name (nil: none).
func (t *NICTimings) Durations() (map[string]time.Duration, error) { return timingMap(t) }

// TimedCalls are the call names timings may name: the JSON names of
// GPUTimings' and NICTimings' fields.
func TimedCalls() []string {
	var names []string
	for _, t := range []any{GPUTimings{}, NICTimings{}} {
		typ := reflect.TypeOf(t)
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			names = append(names, name)
		}
	}
	return names
}
