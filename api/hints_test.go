// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package api

import (
	"strings"
	"testing"
)

// TestDriverHint: a near miss of hwdra's driver names gets the name it
// misses; NVIDIA's driver gets hwdra convert; other vendors' get nothing.
func TestDriverHint(t *testing.T) {
	for driver, want := range map[string]string{
		"gpu.hwdra.com":   "did you mean gpu.hwdra.io?",
		"gpu.hwdra.i":     "did you mean gpu.hwdra.io?",
		"srivo.hwdra.io":  "did you mean sriov.hwdra.io?",
		"gpu.nvidia.com":  convertHint,
		"gpu.hwdra.io":    "",
		"dra.example.com": "",
		"net.intel.com":   "",
	} {
		if got := DriverHint(driver); got != want {
			t.Errorf("%s: %q, want %q", driver, got, want)
		}
	}
}

// TestNVIDIAConfigPointsAtConvert: a resource.nvidia.com config is named
// NVIDIA's, with hwdra convert, and not answered with hwdra's own types
// (the agent's AgentConfig among them).
func TestNVIDIAConfigPointsAtConvert(t *testing.T) {
	_, err := Decode([]byte("apiVersion: resource.nvidia.com/v1beta1\nkind: GpuConfig\nsharing: {strategy: MPS}\n"))
	if err == nil || !strings.Contains(err.Error(), "GpuConfig is written for NVIDIA's GPU DRA driver: `hwdra convert` rewrites") || strings.Contains(err.Error(), "AgentConfig") {
		t.Errorf("error %v", err)
	}
}
