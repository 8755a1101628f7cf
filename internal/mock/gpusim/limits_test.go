// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// chartLimits is the file the chart's claim-limits policy reads.
var chartLimits = filepath.Join("..", "..", "..", "deploy", "helm", "hwdra", "files", "per-gpu-limits.json")

// TestChartPerGPULimits: the chart's table of partitions per GPU is
// MaxPerGPU (HWDRA_UPDATE=1 rewrites it), and holds what NVIDIA's tables
// say for the profiles claims ask for most.
func TestChartPerGPULimits(t *testing.T) {
	limits := MaxPerGPU()
	for name, want := range map[string]int{"1g.10gb": 7, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1, "1g.10gb+me": 1, "H100-8C": 10, "H100-80C": 1, "H100-1-10C": 7} {
		if limits[name] != want {
			t.Errorf("%s: %d per GPU, want %d", name, limits[name], want)
		}
	}
	data, err := json.MarshalIndent(limits, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	data = append(data, '\n')
	if os.Getenv("HWDRA_UPDATE") == "1" {
		if err := os.WriteFile(chartLimits, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	have, err := os.ReadFile(chartLimits)
	if err != nil {
		t.Fatal(err)
	}
	if string(have) != string(data) {
		t.Errorf("%s is not MaxPerGPU: run HWDRA_UPDATE=1 go test -run TestChartPerGPULimits ./internal/mock/gpusim/", chartLimits)
	}
}
