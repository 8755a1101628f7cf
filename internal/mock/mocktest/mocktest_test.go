// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package mocktest

import (
	"os"
	"path/filepath"
	"testing"
)

// TestOpen: a built-in name, a profile file and inline YAML each give
// their hardware; closing it before the test ends is fine.
func TestOpen(t *testing.T) {
	file := filepath.Join(t.TempDir(), "one.yaml")
	if err := os.WriteFile(file, []byte("gpus: [{model: a100-40gb, count: 1}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec, name string
		gpus       int
		pfs        int
	}{
		{"dgx-h100", "dgx-h100", 8, 10},
		{file, "one", 1, 0},
		{"nics: [{model: cx7, count: 2}]", "test", 0, 2},
	} {
		h := Open(t, tc.spec)
		if h.Profile.Name != tc.name || len(h.NICs().Netdevs()) != tc.pfs {
			t.Errorf("%s: profile %q with %d PFs, want %q with %d", tc.spec, h.Profile.Name, len(h.NICs().Netdevs()), tc.name, tc.pfs)
		}
		if n := len(h.MdevUUIDs()); n != 0 {
			t.Errorf("%s: %d mediated devices", tc.spec, n)
		}
		if tc.gpus > 0 {
			h.NVML.Init()
			if n, _ := h.NVML.DeviceGetCount(); n != tc.gpus {
				t.Errorf("%s: %d GPUs, want %d", tc.spec, n, tc.gpus)
			}
			h.NVML.Shutdown()
		}
		if err := h.Close(); err != nil {
			t.Error(err)
		}
	}
}
