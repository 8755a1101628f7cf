// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/model"
	mockprofile "github.com/hwdra/hwdra/internal/mock/profile"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// probe reads a mock node through the real backends.
func probe(t testing.TB, spec string) hw.Inventory {
	t.Helper()
	inv, err := backend.Probe(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// TestBuiltinProfiles builds every built-in mock node end to end (mock
// hardware, nvml and sriov backends, slices) and checks the API limits and
// that two fresh mock nodes give byte-identical slices.
func TestBuiltinProfiles(t *testing.T) {
	for _, name := range mockprofile.Builtins() {
		t.Run(name, func(t *testing.T) {
			var first []byte
			for i := 0; i < 2; i++ {
				res, _ := ForNode(testNode, probe(t, "mock:"+name), config.Default(), device.AllFeatures, hw.Health{})
				for _, r := range res {
					checkLimits(t, r)
				}
				out, err := json.Marshal(res)
				if err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					first = out
				} else if string(out) != string(first) {
					t.Fatal("two mock nodes of one profile give different slices")
				}
			}
		})
	}
}

// TestOneMockH100 repeats the partition checks on a GPU read through NVML
// from the mock, rather than on the fixture.
func TestOneMockH100(t *testing.T) {
	file := filepath.Join(t.TempDir(), "one-h100.yaml")
	if err := os.WriteFile(file, []byte("gpus:\n- model: h100-80gb\n  count: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	inv := probe(t, "mock:"+file)
	if len(inv.GPUs) != 1 {
		t.Fatalf("%d GPUs", len(inv.GPUs))
	}
	a, _ := gpuAllocator(t, inv.GPUs...)
	for i := 0; i < 7; i++ {
		if !fits(t, a, claim(profile("mig", "1g.10gb", 1))) {
			t.Fatalf("1g.10gb number %d refused", i+1)
		}
	}
	if fits(t, a, claim(profile("mig", "1g.10gb", 1))) {
		t.Fatal("eighth 1g.10gb allocated")
	}
	a, _ = gpuAllocator(t, inv.GPUs...)
	if !fits(t, a, claim(profile("a", "4g.40gb", 1), profile("b", "3g.40gb", 1))) {
		t.Fatal("4g.40gb + 3g.40gb refused")
	}
	if fits(t, a, claim(profile("c", "1g.10gb", 1))) {
		t.Fatal("1g.10gb allocated beside 4g+3g")
	}
}

// BenchmarkProbeAndBuild: probe a mock DGX H200 through the real backends
// and build its slices. "gpus" is the GPU driver alone (8 GPUs through
// NVML, every GPU slice); "node" adds the NICs (10 PFs and their VFs read
// from sysfs). Target: < 5 ms and < 5 MiB allocated per operation.
func BenchmarkProbeAndBuild(b *testing.B) {
	n, err := backend.Open("mock:dgx-h200")
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	cfg := config.Default()
	ctx := context.Background()
	b.Run("gpus", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			gpus, err := n.GPU().GPUs(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if res := GPU(testNode, gpus, device.AllFeatures); len(res.Pools) == 0 {
				b.Fatal("nothing built")
			}
		}
	})
	b.Run("node", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			inv, err := n.Inventory(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if res, _ := ForNode(testNode, inv, cfg, device.AllFeatures, hw.Health{}); len(res) != 2 {
				b.Fatal("not both drivers built")
			}
		}
	})
}

// TestEveryGPUModel: every GPU model the mock knows, with MIG off, MIG on
// and in host-vGPU mode, gives slices within the API's limits with unique
// device names (B200's "1g.23gb+me" and "1g.23gb-me" once collided), and
// the scheduler's allocator can allocate one device of each kind there.
func TestEveryGPUModel(t *testing.T) {
	for _, model := range model.GPUNames() {
		for _, mode := range gpuModes {
			t.Run(model+"/"+mode.name, func(t *testing.T) {
				skipUnlessMode(t, model, mode.yaml)
				res := mockGPUPool(t, model, mode.yaml, 8)
				checkLimits(t, res)
				kinds := map[string]bool{}
				for _, s := range res.Pools[testNode].Slices {
					for _, d := range s.Devices {
						kinds[*d.Attributes[device.AttrType].StringValue] = true
					}
				}
				if len(kinds) == 0 {
					t.Fatal("no devices")
				}
				for kind := range kinds {
					a := newAllocator(t, allocate.ClusterFeatures, ByDriver{device.GPUDriver: res})
					c := claim(request("one", device.GPUDriver, 1, fmt.Sprintf(`device.attributes["gpu.hwdra.io"].type == %q`, kind)))
					if !fits(t, a, c) {
						t.Errorf("one %s device cannot be allocated", kind)
					}
				}
			})
		}
	}
}
