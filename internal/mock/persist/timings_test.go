// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package persist

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hwdra/hwdra/internal/mock/profile"
)

// TestTimedCallsAreReported: every call a profile may slow down is one the
// mock's parts report, so that no timing is silently ignored.
func TestTimedCallsAreReported(t *testing.T) {
	reported := []string{CallCreateGpuInstance, CallDestroyGpuInstance, CallCreateComputeInstance,
		CallDestroyComputeInstance, CallSetMigMode, CallCreateMdev, CallRemoveMdev, CallSetVGPUType, CallSetVF}
	for _, c := range profile.TimedCalls() {
		if !slices.Contains(reported, c) {
			t.Errorf("timing %q names no reported call", c)
		}
	}
}

func TestEnvTimings(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want map[string]time.Duration
		err  string
	}{
		{"", map[string]time.Duration{}, ""},
		{"createGpuInstance=3s, setVF=500ms", map[string]time.Duration{"createGpuInstance": 3 * time.Second, "setVF": 500 * time.Millisecond}, ""},
		{"createGpuInstance=1s,frobnicate=2s", nil, `"frobnicate=2s" is not <call>=<duration>`},
		{"setVF", nil, `"setVF" is not <call>=<duration>`},
		{"setVF=soon", nil, `setVF: "soon" is not a duration`},
	} {
		t.Setenv(TimingsEnv, tc.env)
		got, err := envTimings()
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), TimingsEnv)):
			t.Errorf("%q: %v, want an error naming %s and containing %q", tc.env, err, TimingsEnv, tc.err)
		case tc.err == "" && (err != nil || len(got) != len(tc.want)):
			t.Errorf("%q: %v, %v; want %v", tc.env, got, err, tc.want)
		}
		for call, d := range tc.want {
			if got[call] != d {
				t.Errorf("%q: %s = %v, want %v", tc.env, call, got[call], d)
			}
		}
	}
}
