package lab

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLabWarnsOfConfigsNoDriverReads: gpu-mps.yaml written for NVIDIA's
// DRA driver (driver gpu.nvidia.com) gets an exclusive GPU without MPS;
// the lab says which config of which claim no driver reads, and the
// agent's prepare logs it.
func TestLabWarnsOfConfigsNoDriverReads(t *testing.T) {
	data, err := os.ReadFile(examples("gpu-mps.yaml")[0])
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "nvidia-mps.yaml")
	if err := os.WriteFile(file, []byte(strings.Replace(string(data), "driver: gpu.hwdra.io", "driver: gpu.nvidia.com", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Run(context.Background(), &out, Options{Hardware: "mock:dgx-h100", ClaimFiles: []string{file}}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	wantOutput(t, out.String(),
		"warning: claim gpu-mps: spec.devices.config[0] is for driver gpu.nvidia.com, which owns none of the devices it applies to (gpu.hwdra.io): no driver reads it",
		`log: "Warning: a configuration of the claim is ignored: spec.devices.config[0] is for driver gpu.nvidia.com`,
		"no MPS control daemons",
	)
	if t.Failed() {
		t.Log(out.String())
	}
}
