// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"fmt"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/hw"
)

// Device is a published device the stream reports on.
type Device struct {
	Pool, Name string
	// Of finds the device's fault.
	Of Faulty
	// Unmonitored says why no monitor watches the device (a GPU bound to
	// vfio-pci, which NVML cannot see). Such a device is reported
	// Unknown, with this as its message, never Healthy: nothing vouches
	// for it.
	Unmonitored string
}

// Faulty finds a device's fault in the node's health: slices.GPUDevice
// and slices.NICDevice, the same lookup that taints the device.
type Faulty interface {
	Fault(hw.Health) (hw.Fault, bool)
}

// Source is what a driver's stream reports on: the agent's node health,
// seen from one driver.
type Source interface {
	// Devices are the driver's published devices now.
	Devices() []Device
	// Faults are what the monitors find wrong now.
	Faults() hw.Health
	// LastCheck is when the driver's monitor last completed a check of
	// its devices; zero while it has completed none (or has none).
	LastCheck() time.Time
	// Changed is closed at the next change of devices or faults.
	Changed() <-chan struct{}
}

// Stream reports one driver's devices to the kubelet (WatchHealthStatus).
type Stream struct {
	Source Source
	// Timeout is every device's HealthCheckTimeout: the kubelet reports a
	// device Unknown when it heard nothing of it for that long (the agent
	// itself hung). Each device is re-sent every Timeout/3.
	Timeout time.Duration
	// StallAfter: once the monitor has completed no check for this long
	// it is stalled (NVML or netlink no longer answer), and the devices it
	// watches are reported Unknown, with a message saying so, until it
	// checks again. The stream goes on meanwhile: the kubelet hears
	// Unknown at once rather than silence it would notice only at its
	// timeout. Zero: 2/3 of Timeout.
	StallAfter time.Duration
	// Monitor names the monitor in that message ("the GPU health monitor
	// (NVML)").
	Monitor string
}

type deviceKey struct{ pool, name string }

type status struct {
	health  kubeletplugin.HealthStatus
	message string
}

// stalledPoll is how often a stalled monitor is looked at for its return:
// a check that completes turns its devices back at once, not at the next
// re-send.
const stalledPoll = time.Second

// Watch sends a report of every device first, then one of the devices
// whose health changed at each change (the monitor stalling or coming
// back included), and all devices again every Timeout/3, until ctx ends
// (then it returns nil).
func (s Stream) Watch(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	logger := klog.FromContext(ctx).WithName("health-stream")
	ticker := time.NewTicker(s.Timeout / 3)
	defer ticker.Stop()
	var last map[deviceKey]status
	full, wasStalled := true, false
	for {
		changed := s.Source.Changed() // before reading: a change meanwhile is not lost
		now, stalled, lastCheck := s.read()
		if stalled != wasStalled {
			if stalled {
				logger.Error(nil, "The health monitor has completed no check for too long: reporting its devices Unknown until it does", "monitor", s.Monitor, "lastCheck", lastCheck, "stallAfter", s.stallAfter())
			} else {
				logger.Info("The health monitor checks again: reporting its devices as it finds them", "monitor", s.Monitor)
			}
			wasStalled = stalled
		}
		var out []kubeletplugin.DeviceHealth
		for d, st := range now {
			if full || last[d] != st {
				out = append(out, kubeletplugin.DeviceHealth{
					PoolName: d.pool, DeviceName: d.name, Health: st.health, Message: st.message,
					LastUpdated: time.Now(), HealthCheckTimeout: s.Timeout,
				})
			}
		}
		if full || len(out) > 0 {
			select {
			case reports <- kubeletplugin.DeviceHealthReport{Devices: out}:
			case <-ctx.Done():
				return nil
			}
			logger.V(4).Info("Sent device health", "devices", len(out), "full", full)
		}
		last, full = now, false
		wake := time.NewTimer(s.nextLook(stalled, lastCheck))
		select {
		case <-ctx.Done():
			wake.Stop()
			return nil
		case <-changed:
		case <-wake.C:
		case <-ticker.C:
			full = true
		}
		wake.Stop()
	}
}

// nextLook is how long until the stream must look at the monitor again
// without being told: the moment it turns stalled, or, stalled, the
// next poll for its return.
func (s Stream) nextLook(stalled bool, lastCheck time.Time) time.Duration {
	if stalled || lastCheck.IsZero() {
		return stalledPoll
	}
	return max(time.Until(lastCheck.Add(s.stallAfter()))+time.Millisecond, time.Millisecond)
}

func (s Stream) stallAfter() time.Duration {
	if s.StallAfter > 0 {
		return s.StallAfter
	}
	return 2 * s.Timeout / 3
}

// read is every device's health now, and whether the monitor is stalled.
func (s Stream) read() (map[deviceKey]status, bool, time.Time) {
	lastCheck := s.Source.LastCheck()
	stalled := lastCheck.IsZero() || time.Since(lastCheck) > s.stallAfter()
	stalledMsg := ""
	if stalled {
		stalledMsg = fmt.Sprintf("health unknown: %s has completed no check for over %s", s.Monitor, s.stallAfter())
		if lastCheck.IsZero() {
			stalledMsg = fmt.Sprintf("health unknown: %s has not completed its first check", s.Monitor)
		}
	}
	h := s.Source.Faults()
	devices := s.Source.Devices()
	out := make(map[deviceKey]status, len(devices))
	for _, d := range devices {
		st := status{health: kubeletplugin.HealthStatusHealthy}
		switch {
		case d.Unmonitored != "":
			st = status{health: kubeletplugin.HealthStatusUnknown, message: d.Unmonitored}
		case stalled:
			st = status{health: kubeletplugin.HealthStatusUnknown, message: stalledMsg}
		default:
			if f, ok := d.Of.Fault(h); ok {
				st = status{health: kubeletplugin.HealthStatusUnhealthy, message: f.Message}
			}
		}
		out[deviceKey{d.Pool, d.Name}] = st
	}
	return out, stalled, lastCheck
}

// DeviceState is a device's health as the stream reports it.
type DeviceState struct {
	Pool, Name string
	Health     kubeletplugin.HealthStatus
}

// States is every device's health now, as the stream reports it.
func (s Stream) States() []DeviceState {
	cur, _, _ := s.read()
	out := make([]DeviceState, 0, len(cur))
	for k, st := range cur {
		out = append(out, DeviceState{Pool: k.pool, Name: k.name, Health: st.health})
	}
	return out
}
