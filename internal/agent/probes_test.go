// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestReadinessAnswers: /readyz is 503 with every reason while the agent
// does not serve; once it serves it is 200 "ok", followed by a line naming
// the GPUs left to NVIDIA's device plugin and a warning line while the
// published device model is reduced (a DRA feature gate off in the API
// server): the node serves, with less, and says so.
func TestReadinessAnswers(t *testing.T) {
	degraded := errors.New("publishing without DRA features the API server drops (DRADeviceCompatibilityGroups): no vGPU devices")
	withheld := "GPUs left to NVIDIA's device plugin: all 8 (its socket nvidia-gpu.sock)"
	none := func() string { return "" }
	for _, tc := range []struct {
		name     string
		setup    func(*probes)
		code     int
		wantBody string
	}{
		{"starting", func(p *probes) { p.setState(stateStarting) }, http.StatusServiceUnavailable, stateStarting + "\n"},
		{"serving, full model", func(p *probes) { p.serving(nil, nil, func() error { return nil }, none) }, http.StatusOK, "ok\n"},
		{"serving, reduced model", func(p *probes) { p.serving(nil, nil, func() error { return degraded }, none) }, http.StatusOK, "ok\nwarning: " + degraded.Error() + "\n"},
		{"serving, GPUs withheld and reduced model", func(p *probes) {
			p.serving(nil, nil, func() error { return degraded }, func() string { return withheld })
		}, http.StatusOK, "ok\n" + withheld + "\nwarning: " + degraded.Error() + "\n"},
		{"not published, reduced model", func(p *probes) {
			p.serving(func() error { return errors.New("ResourceSlices: gpu.hwdra.io: not published yet") }, nil, func() error { return degraded }, none)
		}, http.StatusServiceUnavailable, "ResourceSlices: gpu.hwdra.io: not published yet\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProbes()
			tc.setup(p)
			rec := httptest.NewRecorder()
			p.handler(p.ready, p.notes)(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			body, _ := io.ReadAll(rec.Result().Body)
			if rec.Code != tc.code || string(body) != tc.wantBody {
				t.Errorf("/readyz: %d %q, want %d %q", rec.Code, body, tc.code, tc.wantBody)
			}
		})
	}
}

// TestClaimLimitWarning: a node with more GPUs than the claim-limits
// policy allows a claim warns, naming both numbers and the value to set;
// a node within the limit, or no policy, does not.
func TestClaimLimitWarning(t *testing.T) {
	for _, tc := range []struct {
		limit, gpus int
		warn        bool
	}{{8, 8, false}, {8, 4, false}, {0, 16, false}, {8, 16, true}, {4, 8, true}} {
		err := claimLimitWarning(tc.limit, tc.gpus)
		if (err != nil) != tc.warn {
			t.Errorf("limit %d, %d GPUs: %v, want a warning %v", tc.limit, tc.gpus, err, tc.warn)
			continue
		}
		if err != nil && (!strings.Contains(err.Error(), fmt.Sprintf("has %d GPUs", tc.gpus)) ||
			!strings.Contains(err.Error(), fmt.Sprintf("more than %d GPUs", tc.limit)) || !strings.Contains(err.Error(), "claimLimits.gpusPerNode")) {
			t.Errorf("limit %d, %d GPUs: %q does not name both and the value to set", tc.limit, tc.gpus, err)
		}
	}
	// Two warnings, a line each.
	p := newProbes()
	p.serving(nil, nil, func() error {
		return errors.Join(errors.New("publishing without X"), claimLimitWarning(8, 16))
	}, func() string { return "" })
	notes := p.notes()
	if len(notes) != 2 || !strings.HasPrefix(notes[0], "warning: publishing without X") || !strings.HasPrefix(notes[1], "warning: this node has 16 GPUs") {
		t.Errorf("notes %q, want a warning line for each", notes)
	}
}
