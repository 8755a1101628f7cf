// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"strings"
	"testing"

	gpuv1alpha1 "github.com/hwdra/hwdra/api/gpu/v1alpha1"
)

// TestGpuSharing: a sharing strategy decodes with its defaults, and every
// bad one is refused naming the field.
func TestGpuSharing(t *testing.T) {
	t.Parallel()
	const gpu = "apiVersion: gpu.hwdra.io/v1alpha1\nkind: GpuConfig\n"
	decode := func(doc string) (*gpuv1alpha1.GpuConfig, error) {
		obj, err := Decode([]byte(gpu + doc))
		if err != nil {
			return nil, err
		}
		return obj.(*gpuv1alpha1.GpuConfig), nil
	}
	c, err := decode("sharing: {strategy: TimeSlicing}\n")
	if err != nil || c.Sharing.TimeSlicing == nil || c.Sharing.TimeSlicing.Interval != gpuv1alpha1.IntervalDefault {
		t.Fatalf("time slicing without an interval: %+v, %v", c, err)
	}
	c, err = decode("sharing: {strategy: MPS, mps: {defaultActiveThreadPercentage: 50, defaultPinnedDeviceMemoryLimit: 10Gi}}\n")
	if err != nil || *c.Sharing.MPS.DefaultActiveThreadPercentage != 50 || c.Sharing.MPS.DefaultPinnedDeviceMemoryLimit.Value() != 10<<30 {
		t.Fatalf("MPS: %+v, %v", c, err)
	}
	c, err = decode("share: {}\n")
	if err != nil || c.Share.Isolation != gpuv1alpha1.Policed {
		t.Fatalf("a share without an isolation: %+v, %v", c, err)
	}
	c, err = decode("share: {isolation: Dedicated}\n")
	if err != nil || c.Share.Isolation != gpuv1alpha1.Dedicated {
		t.Fatalf("a dedicated share: %+v, %v", c, err)
	}
	if i := gpuv1alpha1.IntervalLong.Index(); i != 3 {
		t.Errorf("Long is %d for nvidia-smi, want 3", i)
	}
	for _, tc := range []struct{ name, doc, want string }{
		{"no strategy", "sharing: {}\n", "sharing.strategy: Required value"},
		{"unknown strategy", "sharing: {strategy: Spatial}\n", `sharing.strategy: Unsupported value: "Spatial": supported values: "TimeSlicing", "MPS"`},
		{"unknown interval", "sharing: {strategy: TimeSlicing, timeSlicing: {interval: Forever}}\n",
			`sharing.timeSlicing.interval: Unsupported value: "Forever": supported values: "Default", "Short", "Medium", "Long"`},
		{"MPS settings with time slicing", "sharing: {strategy: TimeSlicing, mps: {}}\n", "sharing.mps: Forbidden: only with strategy MPS"},
		{"time slice with MPS", "sharing: {strategy: MPS, timeSlicing: {interval: Short}}\n", "sharing.timeSlicing: Forbidden: only with strategy TimeSlicing"},
		{"no threads", "sharing: {strategy: MPS, mps: {defaultActiveThreadPercentage: 0}}\n",
			"sharing.mps.defaultActiveThreadPercentage: Invalid value: 0: must be between 1 and 100"},
		{"more than all threads", "sharing: {strategy: MPS, mps: {defaultActiveThreadPercentage: 101}}\n",
			"sharing.mps.defaultActiveThreadPercentage: Invalid value: 101: must be between 1 and 100"},
		{"too little memory", "sharing: {strategy: MPS, mps: {defaultPinnedDeviceMemoryLimit: 1k}}\n",
			`sharing.mps.defaultPinnedDeviceMemoryLimit: Invalid value: "1k": must be at least 1Mi`},
		{"not a quantity", "sharing: {strategy: MPS, mps: {defaultPinnedDeviceMemoryLimit: lots}}\n", "quantities must match"},
		{"unknown field", "sharing: {strategy: MPS, mps: {threads: 5}}\n", `unknown field "sharing.mps.threads"`},
		{"unknown isolation", "share: {isolation: Exclusive}\n", `share.isolation: Unsupported value: "Exclusive": supported values: "Policed", "Dedicated"`},
		{"isolation in lower case", "share: {isolation: dedicated}\n", `share.isolation: Unsupported value: "dedicated"`},
		{"unknown share field", "share: {isolation: Dedicated, memory: 10Gi}\n", `unknown field "share.memory"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := decode(tc.doc)
			if err == nil {
				t.Fatalf("decoded %+v", c)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\n  lacks %q", err, tc.want)
			}
		})
	}
}
