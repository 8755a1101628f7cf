// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package model_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/hw"
)

// TestH200AsProbed: the mock's h200-141gb, probed as `hwdra probe` probes
// (the nvml backend on the mock's NVML), is the real H200 of
// testdata/probe-h200.yaml in every GPU-level field the mock models: product
// name, PCI device ID, memory, architecture, compute capability, and the MIG
// table (each profile's ID, name, slices, instance count, engines,
// multiprocessors, memory and placements; memory slices, switching without
// a reset, mode). Left out on purpose, as what differs between machines and
// installations, not between GPU models:
//   - uuid: each board's own.
//   - pciBusID, pcieRoot, numaNode, index, minor: where the GPU sits in the
//     machine (the real one is alone in a VM without NUMA; the mock builds
//     DGX nodes).
//   - virtualization: the real GPU is passed through to a VM (NVML's
//     pass-through mode); the mock models bare-metal nodes, whose GPUs say
//     none (a GPU bound to vfio-pci on a host is another thing:
//     profile.VirtualizationPassthrough).
//   - driverVersion, cudaDriverVersion: the installed driver's (580.159.04,
//     CUDA 13.0 there); the mock runs one driver for every model.
func TestH200AsProbed(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "probe-h200.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var real hw.Inventory
	if err := yaml.UnmarshalStrict(data, &real); err != nil {
		t.Fatalf("testdata/probe-h200.yaml: %v", err)
	}
	if len(real.GPUs) != 1 {
		t.Fatalf("testdata/probe-h200.yaml: %d GPUs, want 1", len(real.GPUs))
	}
	spec := filepath.Join(t.TempDir(), "h200.yaml")
	if err := os.WriteFile(spec, []byte("gpus: [{model: h200-141gb, count: 1}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	node, err := backend.OpenWith("mock:"+spec, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	inv, err := node.Inventory(context.Background())
	if err != nil || len(inv.GPUs) != 1 {
		t.Fatalf("mock probe: %d GPUs, %v", len(inv.GPUs), err)
	}
	var diffs []string
	diff(&diffs, "gpu", reflect.ValueOf(modelled(inv.GPUs[0])), reflect.ValueOf(modelled(real.GPUs[0])))
	for _, d := range diffs {
		t.Error(d)
	}
}

// modelled is a GPU without the fields TestH200AsProbed leaves out.
func modelled(g hw.GPU) hw.GPU {
	g.UUID = ""
	g.PCIBusID, g.PCIeRoot, g.NUMANode, g.Index, g.Minor = "", "", 0, 0, 0
	g.Virtualization = ""
	g.DriverVersion, g.CUDADriverVersion = "", ""
	return g
}

// diff lists where mock and real differ, by field path.
func diff(out *[]string, path string, mock, real reflect.Value) {
	switch mock.Kind() {
	case reflect.Struct:
		for i := range mock.NumField() {
			diff(out, path+"."+mock.Type().Field(i).Name, mock.Field(i), real.Field(i))
		}
	case reflect.Slice:
		if mock.Len() != real.Len() {
			*out = append(*out, fmt.Sprintf("%s: the mock has %d, the real GPU %d: %+v, real %+v", path, mock.Len(), real.Len(), mock.Interface(), real.Interface()))
			return
		}
		for i := range mock.Len() {
			diff(out, fmt.Sprintf("%s[%d]", path, i), mock.Index(i), real.Index(i))
		}
	default:
		if reflect.DeepEqual(mock.Interface(), real.Interface()) {
			return
		}
		format := "%s: the mock has %v, the real GPU %v"
		if mock.Kind() == reflect.Uint32 { // PCI IDs
			format = "%s: the mock has %#x, the real GPU %#x"
		}
		*out = append(*out, fmt.Sprintf(format, path, mock.Interface(), real.Interface()))
	}
}
