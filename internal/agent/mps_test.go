// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/state"
)

// mpsDaemonPID reads the PID of the one MPS daemon the agent recorded.
func mpsDaemonPID(t testing.TB, stateDir string) int {
	t.Helper()
	raw, err := state.Read(filepath.Join(stateDir, device.GPUDriver+".mps.json"), state.LedgerFormat)
	if err != nil {
		t.Fatal(err)
	}
	var daemons map[string]struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(raw, &daemons); err != nil || len(daemons) != 1 {
		t.Fatalf("MPS daemons %s: %v", raw, err)
	}
	for _, d := range daemons {
		return d.PID
	}
	return 0
}

// TestHealthMPSDaemonDown: the MPS daemon of a claim's GPU dies; the
// agent starts it again, and the kubelet hears the GPU was Unhealthy
// meanwhile, then Healthy.
func TestHealthMPSDaemonDown(t *testing.T) {
	a := startAgent(t, "gpus:\n- model: h100-80gb\n  count: 1\n")
	full := device.GPUName("0000:1b:00.0")
	req := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: device.GPUDriver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
	}}
	c := a.allocatedWith(a.slices(device.GPUDriver, nil), "mps", req,
		`{"apiVersion": "gpu.hwdra.io/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}`)
	prepareClaims(t, a, device.GPUDriver, c)
	// The daemon outlives the agent, as it would a restart: ended here,
	// and its shared memory's tmpfs unmounted.
	t.Cleanup(func() {
		_ = syscall.Kill(mpsDaemonPID(t, a.opts.StateDir), syscall.SIGKILL)
		shms, _ := filepath.Glob(filepath.Join(a.opts.StateDir, "mps", "*", "shm"))
		for _, shm := range shms {
			_ = syscall.Unmount(shm, syscall.MNT_DETACH)
		}
	})
	w := a.watchHealth(device.GPUDriver)
	w.wait("the GPU Healthy", func(d map[string]*drahealthv1.DeviceHealth) bool {
		return d[full] != nil && d[full].Health == drahealthv1.HealthStatus_HEALTHY
	})
	pid := mpsDaemonPID(t, a.opts.StateDir)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	w.wait("the GPU Unhealthy for its MPS daemon", func(d map[string]*drahealthv1.DeviceHealth) bool {
		return d[full] != nil && d[full].Health == drahealthv1.HealthStatus_UNHEALTHY && strings.Contains(d[full].Message, "MPS control daemon")
	})
	w.wait("the GPU Healthy again", func(d map[string]*drahealthv1.DeviceHealth) bool {
		return d[full] != nil && d[full].Health == drahealthv1.HealthStatus_HEALTHY
	})
	again := mpsDaemonPID(t, a.opts.StateDir)
	if again == pid {
		t.Fatalf("daemon PID %d: not started again", again)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(again)); err != nil {
		t.Errorf("the new daemon %d does not run: %v", again, err)
	}
}
