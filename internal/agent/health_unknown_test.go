// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"strings"
	"testing"
	"time"

	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/mock/fault"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

// TestHealthUnknownStalledMonitor: a GPU that stops answering (the mock's
// stall: its health queries block, its events are held) stalls the GPU
// health monitor. The kubelet's stream then reports every GPU device
// Unknown, with a message naming the monitor, within the timeout (not
// silence), and the NIC driver's devices stay Healthy: another monitor
// watches them. The XID raised during the stall is reported once the GPU
// answers again, and recovery after it brings every device back.
func TestHealthUnknownStalledMonitor(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(persist.DirEnv, dir)
	times := healthTimes{gpuCheck: 100 * time.Millisecond, gpuTimeout: 900 * time.Millisecond,
		mpsCheck: time.Second, nicCheck: 100 * time.Millisecond, nicTimeout: 900 * time.Millisecond}
	a := startAgentWith(t, Options{Hardware: "mock:dgx-h100", healthTimes: &times})
	const bus = "0000:1b:00.0"
	gpus := deviceNames(a.slices(device.GPUDriver, nil))
	w := a.watchHealth(device.GPUDriver)
	nics := a.watchHealth(device.NICDriver)
	all := func(want drahealthv1.HealthStatus, message string) func(map[string]*drahealthv1.DeviceHealth) bool {
		return func(d map[string]*drahealthv1.DeviceHealth) bool {
			for name := range gpus {
				if h := d[name]; h == nil || h.Health != want || !strings.Contains(h.Message, message) {
					return false
				}
			}
			return true
		}
	}
	w.wait("every GPU device Healthy", all(drahealthv1.HealthStatus_HEALTHY, ""))

	inject(t, dir, fault.Fault{Kind: fault.Stall, GPU: bus})
	t.Cleanup(func() { inject(t, dir, fault.Fault{Kind: fault.Resume, GPU: bus}) }) // never leave a check blocked
	inject(t, dir, fault.Fault{Kind: fault.XID, GPU: bus, XID: 79})
	// Stalled after 2/3 of the kubelet's timeout (600ms of 900ms), as the
	// message says: not a wall-clock bound, which a loaded race run
	// overshot (1.37 s; health.TestStreamResends covers the sending).
	w.wait("every GPU device Unknown, the monitor named", all(drahealthv1.HealthStatus_UNKNOWN, "the GPU health monitor (NVML events and checks) has completed no check for over 600ms"))
	nics.wait("NIC devices still Healthy", func(d map[string]*drahealthv1.DeviceHealth) bool {
		for _, h := range d {
			if h.Health != drahealthv1.HealthStatus_HEALTHY {
				return false
			}
		}
		return len(d) > 0
	})
	if got := a.metric(`hwdra_device_health_state{device="` + device.GPUName(bus) + `",driver="gpu.hwdra.io",pool="` + node + `",state="Unknown"}`); got != "1" {
		t.Errorf("hwdra_device_health_state of a stalled monitor's device: Unknown %q", got)
	}

	inject(t, dir, fault.Fault{Kind: fault.Resume, GPU: bus})
	w.wait("the held XID 79 reported once the GPU answers", func(d map[string]*drahealthv1.DeviceHealth) bool {
		h := d[device.GPUName(bus)]
		return h != nil && h.Health == drahealthv1.HealthStatus_UNHEALTHY && strings.Contains(h.Message, "XID 79")
	})
	inject(t, dir, fault.Fault{Kind: fault.Clear, GPU: bus})
	w.wait("every GPU device Healthy again", all(drahealthv1.HealthStatus_HEALTHY, ""))
}

// TestHealthUnknownPassthrough: a GPU bound to vfio-pci, which NVML cannot
// see, is streamed Unknown with the reason, from the first report and at
// every re-send, never Healthy; the GPUs NVML sees are Healthy beside it.
func TestHealthUnknownPassthrough(t *testing.T) {
	times := defaultHealthTimes
	times.gpuCheck, times.gpuTimeout = 100*time.Millisecond, 900*time.Millisecond
	a := startAgentWith(t, Options{Hardware: "mock:h100-vm", healthTimes: &times})
	names := deviceNames(a.slices(device.GPUDriver, nil))
	passthrough := ""
	for name := range names {
		if strings.HasSuffix(name, "-passthrough") {
			passthrough = name
		}
	}
	if passthrough == "" {
		t.Fatalf("h100-vm publishes no passthrough GPU: %v", names)
	}
	w := a.watchHealth(device.GPUDriver)
	w.wait("the passthrough GPU Unknown, every other device Healthy", func(d map[string]*drahealthv1.DeviceHealth) bool {
		for name := range names {
			h := d[name]
			if h == nil {
				return false
			}
			if name == passthrough {
				if h.Health != drahealthv1.HealthStatus_UNKNOWN || !strings.Contains(h.Message, "bound to vfio-pci is invisible to NVML") {
					t.Fatalf("passthrough GPU reported %v %q", h.Health, h.Message)
				}
			} else if h.Health != drahealthv1.HealthStatus_HEALTHY {
				return false
			}
		}
		return true
	})
	// Several re-sends later it is still Unknown: never vouched for.
	w.mu.Lock()
	reports := w.reports
	w.mu.Unlock()
	w.wait("three re-sends", func(map[string]*drahealthv1.DeviceHealth) bool { return w.reports >= reports+3 })
	w.mu.Lock()
	h := w.devices[passthrough]
	w.mu.Unlock()
	if h.Health != drahealthv1.HealthStatus_UNKNOWN {
		t.Errorf("passthrough GPU after re-sends: %v", h.Health)
	}
}
