// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package backend

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/mock/mocktest"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

func TestOpenRejectsUnknownHardware(t *testing.T) {
	for _, spec := range []string{"", "gpu", "mock:", "mock:nope"} {
		if _, err := Open(spec); err == nil || !strings.Contains(err.Error(), "mock") {
			t.Errorf("Open(%q): %v", spec, err)
		}
	}
}

// TestNVMLPending: on a node whose PCI bus shows NVIDIA GPUs but whose
// driver is not loaded yet, NVML stays pending (no GPU, no call into it)
// until InitNVML succeeds; a node without NVIDIA GPUs has nothing pending.
func TestNVMLPending(t *testing.T) {
	n, err := Open("mock:cx7")
	if err != nil {
		t.Fatal(err)
	}
	if n.GPU() != nil || n.NVMLPending() {
		t.Errorf("NIC-only node: GPU %v, pending %v", n.GPU(), n.NVMLPending())
	}
	n.Close()

	// GPUs bound to vfio-pci wait for no NVIDIA driver: none is installed.
	n, err = Open("mock:" + writeProfile(t, "gpus: [{model: h100-80gb, count: 2, virtualization: passthrough}]"))
	if err != nil {
		t.Fatal(err)
	}
	if inv, err := n.Inventory(context.Background()); n.GPU() != nil || n.NVMLPending() || err != nil || len(inv.PassthroughGPUs) != 2 {
		t.Errorf("vfio-pci GPUs only: GPU %v, pending %v, passthrough GPUs %v, %v", n.GPU(), n.NVMLPending(), inv.PassthroughGPUs, err)
	}
	n.Close()

	t.Setenv(persist.DirEnv, t.TempDir())
	spec := writeProfile(t, "gpus: [{model: h100-80gb, count: 2}]\n")
	h := mocktest.Open(t, spec) // the hardware before the agent: driver not loaded
	if err := h.SetDriverLoaded(false); err != nil {
		t.Fatal(err)
	}
	h.Close()

	n, err = Open("mock:" + spec)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.GPU() != nil || !n.NVMLPending() {
		t.Fatalf("driver not loaded: GPU %v, pending %v", n.GPU(), n.NVMLPending())
	}
	inv, err := n.Inventory(context.Background())
	if err != nil || len(inv.GPUs) != 0 {
		t.Fatalf("inventory without NVML: %d GPUs, %v", len(inv.GPUs), err)
	}
	if err := n.InitNVML(); err == nil {
		t.Fatal("InitNVML succeeded without the driver")
	}
	if err := n.Mock().SetDriverLoaded(true); err != nil {
		t.Fatal(err)
	}
	if err := n.InitNVML(); err != nil {
		t.Fatal(err)
	}
	if inv, err := n.Inventory(context.Background()); err != nil || len(inv.GPUs) != 2 || n.NVMLPending() {
		t.Fatalf("after the driver loaded: %d GPUs, %v, pending %v", len(inv.GPUs), err, n.NVMLPending())
	}
}

// writeProfile writes a mock profile file.
func writeProfile(t *testing.T, yaml string) string {
	t.Helper()
	spec := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(spec, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return spec
}
