package mock

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"
)

// TimingsEnv slows every device of the mock down, overriding the
// profile's timings: a comma-separated list of <call>=<duration>, e.g.
// HWDRA_MOCK_TIMINGS=createGpuInstance=3s,setVF=2s. The call names are the
// JSON names of GPUTimings' and NICTimings' fields.
const TimingsEnv = "HWDRA_MOCK_TIMINGS"

// Duration is a Go duration string in a profile ("3s", "500ms").
type Duration string

func (d Duration) parse() (time.Duration, error) {
	if d == "" {
		return 0, nil
	}
	v, err := time.ParseDuration(string(d))
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a duration like 3s or 500ms", string(d))
	}
	return v, nil
}

// GPUTimings say how long the GPU calls of a group take (unset: no time at
// all). The change a call makes happens, and is saved (HWDRA_MOCK_DIR),
// when the call starts; then the call blocks for its duration before it
// returns, as a driver ioctl that a signal cannot interrupt: a process
// killed meanwhile leaves the change made but never learns its result
// (a GPU instance's ID, ...). While it blocks, the mock's directory holds a
// marker busy/<call>.<n> naming the call and the device (ReadState reports
// them as Busy), so a test can wait for it and then kill the caller.
type GPUTimings struct {
	// NVML calls: nvmlDeviceCreateGpuInstance(WithPlacement),
	// nvmlGpuInstanceDestroy, nvmlGpuInstanceCreateComputeInstance(...),
	// nvmlComputeInstanceDestroy, nvmlDeviceSetMigMode.
	CreateGpuInstance      Duration `json:"createGpuInstance,omitempty"`
	DestroyGpuInstance     Duration `json:"destroyGpuInstance,omitempty"`
	CreateComputeInstance  Duration `json:"createComputeInstance,omitempty"`
	DestroyComputeInstance Duration `json:"destroyComputeInstance,omitempty"`
	SetMigMode             Duration `json:"setMigMode,omitempty"`
	// Writes to mdev_supported_types/<type>/create and <mdev>/remove.
	CreateMdev Duration `json:"createMdev,omitempty"`
	RemoveMdev Duration `json:"removeMdev,omitempty"`
}

// NICTimings say how long the VF calls on a group's PFs take, with the
// same meaning as GPUTimings.
type NICTimings struct {
	// SetVF is one VF configuration (hw.VFConfigurator.SetVF: the netlink
	// requests that set MAC, VLAN, rate, trust, spoof check, MTU, state).
	SetVF Duration `json:"setVF,omitempty"`
}

// The calls the mock reports to its control (persist.go). Those in
// GPUTimings and NICTimings can be slowed down; the others only save.
const (
	opCreateGpuInstance      = "createGpuInstance"
	opDestroyGpuInstance     = "destroyGpuInstance"
	opCreateComputeInstance  = "createComputeInstance"
	opDestroyComputeInstance = "destroyComputeInstance"
	opSetMigMode             = "setMigMode"
	opCreateMdev             = "createMdev"
	opRemoveMdev             = "removeMdev"
	opSetVF                  = "setVF"
	opResetGPU               = "resetGpu"
	opSetRunningProcesses    = "setRunningProcesses"
	opXID                    = "xid"
	opGPULost                = "gpuLost"
	opClearGPU               = "clearGpu"
	opSetLink                = "setLink"
	opLoadDriver             = "loadDriver"
)

// timingMap is the set fields of a GPUTimings or NICTimings (a pointer,
// maybe nil) by call name.
func timingMap(t any) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	v := reflect.ValueOf(t)
	if v.IsNil() {
		return out, nil
	}
	v = v.Elem()
	for i := range v.NumField() {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		d, err := v.Field(i).Interface().(Duration).parse()
		if err != nil {
			return nil, fmt.Errorf("timings.%s: %w", name, err)
		}
		if d > 0 {
			out[name] = d
		}
	}
	return out, nil
}

func (t *GPUTimings) validate() error { _, err := timingMap(t); return err }
func (t *NICTimings) validate() error { _, err := timingMap(t); return err }

// timedCalls are the call names timings may name.
func timedCalls() []string {
	var names []string
	for _, t := range []any{GPUTimings{}, NICTimings{}} {
		typ := reflect.TypeOf(t)
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			names = append(names, name)
		}
	}
	return names
}

// envTimings parses TimingsEnv.
func envTimings() (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	spec := strings.TrimSpace(os.Getenv(TimingsEnv))
	if spec == "" {
		return out, nil
	}
	known := timedCalls()
	for _, item := range strings.Split(spec, ",") {
		name, value, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || !slices.Contains(known, name) {
			return nil, fmt.Errorf("%s: %q is not <call>=<duration> with a call among %s", TimingsEnv, item, strings.Join(known, ", "))
		}
		d, err := Duration(value).parse()
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", TimingsEnv, name, err)
		}
		out[name] = d
	}
	return out, nil
}
