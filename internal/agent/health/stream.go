package health

import (
	"context"
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
	// Alive reports whether the driver's monitor completed a check
	// within d. A stalled monitor's devices are not re-sent: the kubelet
	// lets them decay to Unknown instead of trusting stale news.
	Alive(d time.Duration) bool
	// Changed is closed at the next change of devices or faults.
	Changed() <-chan struct{}
}

// Stream reports one driver's devices to the kubelet (WatchHealthStatus).
type Stream struct {
	Source Source
	// Timeout is every device's HealthCheckTimeout; each device is
	// re-sent every Timeout/3.
	Timeout time.Duration
}

type deviceKey struct{ pool, name string }

type status struct {
	health  kubeletplugin.HealthStatus
	message string
}

// Watch sends a report of every device first, then one of the devices
// whose health changed at each change, and all devices again every
// Timeout/3 while the monitor is alive, until ctx ends (then it returns
// nil).
func (s Stream) Watch(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	logger := klog.FromContext(ctx).WithName("health-stream")
	resend := s.Timeout / 3
	ticker := time.NewTicker(resend)
	defer ticker.Stop()
	var last map[deviceKey]status
	full := true
	stalled := false
	for {
		changed := s.Source.Changed() // before reading: a change meanwhile is not lost
		now := s.current()
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
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-ticker.C:
			alive := s.Source.Alive(s.Timeout - resend)
			if !alive && !stalled {
				logger.Error(nil, "The health monitor has not checked the devices for too long: not vouching for them, the kubelet will report them Unknown", "within", s.Timeout-resend)
			}
			stalled = !alive
			full = alive
		}
	}
}

// current is every device's health now.
func (s Stream) current() map[deviceKey]status {
	h := s.Source.Faults()
	devices := s.Source.Devices()
	out := make(map[deviceKey]status, len(devices))
	for _, d := range devices {
		st := status{health: kubeletplugin.HealthStatusHealthy}
		if f, ok := d.Of.Fault(h); ok {
			st = status{health: kubeletplugin.HealthStatusUnhealthy, message: f.Message}
		}
		out[deviceKey{d.Pool, d.Name}] = st
	}
	return out
}

// DeviceState is a device's health as the stream reports it.
type DeviceState struct {
	Pool, Name string
	Health     kubeletplugin.HealthStatus
}

// States is every device's health now, as the kubelet sees it: Unknown
// while the monitor has not checked within 2/3 of the timeout (the stream
// then stops re-sending and the kubelet lets the devices decay).
func (s Stream) States() []DeviceState {
	alive := s.Source.Alive(2 * s.Timeout / 3)
	cur := s.current()
	out := make([]DeviceState, 0, len(cur))
	for k, st := range cur {
		h := st.health
		if !alive {
			h = kubeletplugin.HealthStatusUnknown
		}
		out = append(out, DeviceState{Pool: k.pool, Name: k.name, Health: h})
	}
	return out
}
