// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package persist

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hwdra/hwdra/internal/mock/profile"
)

// TimingsEnv slows every device of the mock down, overriding the
// profile's timings: a comma-separated list of <call>=<duration>, e.g.
// HWDRA_MOCK_TIMINGS=createGpuInstance=3s,setVF=2s. The call names are the
// JSON names of profile.GPUTimings' and profile.NICTimings' fields.
const TimingsEnv = "HWDRA_MOCK_TIMINGS"

// The calls the mock's parts report (Reporter.Changed). Those named in
// profile.GPUTimings and profile.NICTimings can be slowed down; the others
// only save.
const (
	CallCreateGpuInstance      = "createGpuInstance"
	CallDestroyGpuInstance     = "destroyGpuInstance"
	CallCreateComputeInstance  = "createComputeInstance"
	CallDestroyComputeInstance = "destroyComputeInstance"
	CallSetMigMode             = "setMigMode"
	CallCreateMdev             = "createMdev"
	CallRemoveMdev             = "removeMdev"
	CallSetVGPUType            = "setVgpuType"
	CallSetVF                  = "setVF"
	CallResetGPU               = "resetGpu"
	CallSetRunningProcesses    = "setRunningProcesses"
	CallXID                    = "xid"
	CallGPULost                = "gpuLost"
	CallClearGPU               = "clearGpu"
	CallSetLink                = "setLink"
	CallLoadDriver             = "loadDriver"
	CallSetComputeMode         = "setComputeMode"
	CallSetTimeSlice           = "setTimeSlice"
)

// envTimings parses TimingsEnv.
func envTimings() (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	spec := strings.TrimSpace(os.Getenv(TimingsEnv))
	if spec == "" {
		return out, nil
	}
	known := profile.TimedCalls()
	for _, item := range strings.Split(spec, ",") {
		name, value, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || !slices.Contains(known, name) {
			return nil, fmt.Errorf("%s: %q is not <call>=<duration> with a call among %s", TimingsEnv, item, strings.Join(known, ", "))
		}
		d, err := profile.Duration(value).Parse()
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", TimingsEnv, name, err)
		}
		out[name] = d
	}
	return out, nil
}
