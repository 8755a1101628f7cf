// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/mock/drivertools"
)

func envOf(spec *oci.Spec) map[string]string {
	out := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

// daemonLog is what the mock MPS daemon of id was told (commands that
// it took, liveness checks left out), and the devices it was started
// with, by process.
func (e *env) daemonLog(id string) (starts []string, told []string) {
	e.t.Helper()
	events, err := drivertools.MPSLog(e.driver.MPS().Dirs(id).Log)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, ev := range events {
		switch {
		case ev.Event == "start":
			starts = append(starts, ev.VisibleDevices)
		case ev.Event == "command" && !ev.Failed && ev.Command != "get_server_list":
			told = append(told, ev.Command)
		}
	}
	return starts, told
}

// onlyDaemon is the one MPS daemon recorded.
func (e *env) onlyDaemon() string {
	e.t.Helper()
	ids := e.driver.MPS().IDs()
	if len(ids) != 1 {
		e.t.Fatalf("MPS daemons %v, want one", ids)
	}
	return ids[0]
}

// TimeSlicing sets the GPU's time slice (and makes it shareable) for the
// claim, and unprepare gives the GPU back as it was.
func TestTimeSlicing(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 2}]", true)
	before := e.hwState()
	c := e.claim(request{name: "gpu", cel: `profile == "full"`, config: sharingConfig(`{"strategy": "TimeSlicing", "timeSlicing": {"interval": "Medium"}}`)})
	devs := e.mustPrepare(c)
	g := e.gpuOf(devs[0].DeviceName).PCIBusID
	if slice, _ := e.hw.TimeSlice(g); slice != 2 {
		t.Errorf("time slice %d, want 2 (Medium)", slice)
	}
	if env := envOf(e.inject(devs)); env[mps.PipeDirEnv] != "" {
		t.Errorf("a time-sliced GPU's container points at an MPS daemon: %v", env)
	}
	if ids := e.driver.MPS().IDs(); len(ids) != 0 {
		t.Errorf("MPS daemons for a time-sliced claim: %v", ids)
	}
	e.unprepare(c)
	e.wantAsBefore(t, before, "after unprepare")
}

// One claim over two GPUs with MPS: one daemon serves both with the
// claim's defaults, the GPUs are exclusive to it, the container reaches
// it with its limits, a repeated prepare leaves it alone, and unprepare
// stops it and gives the GPUs back.
func TestMPSClaim(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 2}]", true)
	before := e.hwState()
	cfg := sharingConfig(`{"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 30, "defaultPinnedDeviceMemoryLimit": "8Gi"}}`)
	c := e.claim(request{name: "a", cel: `profile == "full"`, config: cfg}, request{name: "b", cel: `profile == "full"`, config: cfg})
	devs := e.mustPrepare(c)
	id := e.onlyDaemon()
	var uuids []string
	for _, d := range devs {
		g := e.gpuOf(d.DeviceName)
		uuids = append(uuids, g.UUID)
		if mode, _ := e.nvml.ComputeMode(g.PCIBusID); mode != nvml.ComputeExclusiveProcess {
			t.Errorf("GPU %s: compute mode %s under MPS", g.PCIBusID, mode)
		}
	}
	starts, told := e.daemonLog(id)
	want := []string{"set_default_active_thread_percentage 30", "set_default_device_pinned_mem_limit 0 8192M",
		"set_default_device_pinned_mem_limit 1 8192M", "get_default_active_thread_percentage"}
	if !slices.Equal(starts, []string{strings.Join(uuids, ",")}) || !slices.Equal(told, want) {
		t.Errorf("daemon started %q, told %q; want one start with %v, told %q", starts, told, uuids, want)
	}
	spec := e.inject(devs)
	env := envOf(spec)
	for k, v := range map[string]string{mps.PipeDirEnv: mps.ContainerPipeDir, mps.ActiveThreadPercentageEnv: "30", mps.PinnedMemoryLimitEnv: "0=8192M,1=8192M"} {
		if env[k] != v {
			t.Errorf("container env %s=%q, want %q", k, env[k], v)
		}
	}
	dirs := e.driver.MPS().Dirs(id)
	mounts := map[string]string{}
	for _, m := range spec.Mounts {
		mounts[m.Destination] = m.Source
	}
	if mounts[mps.ContainerPipeDir] != dirs.Pipe || mounts["/dev/shm"] != dirs.Shm {
		t.Errorf("container mounts %v, want the daemon's pipe %s and shared memory %s", mounts, dirs.Pipe, dirs.Shm)
	}
	e.mustPrepare(c) // the kubelet retries
	if starts, _ := e.daemonLog(id); len(starts) != 1 {
		t.Errorf("daemon started %d times", len(starts))
	}
	e.unprepare(c)
	if after := e.hwState(); after != before {
		t.Errorf("after unprepare:\n%s\nwant\n%s", after, before)
	}
	if _, err := os.Stat(filepath.Dir(dirs.Pipe)); !os.IsNotExist(err) {
		t.Errorf("the daemon's directory after unprepare: %v", err)
	}
}

// MPS in a MIG partition: the daemon serves the MIG device; the GPU's
// compute mode, which the other partitions' claims share, stays.
func TestMPSOnMIG(t *testing.T) {
	e := newEnv(t, "h100-mig", true)
	before := e.hwState()
	c := e.claim(request{name: "mig", cel: `profile == "1g.10gb"`, config: sharingConfig(`{"strategy": "MPS"}`)})
	devs := e.mustPrepare(c)
	starts, _ := e.daemonLog(e.onlyDaemon())
	if uuid := attr(devs[0], "uuid"); len(starts) != 1 || starts[0] != uuid || !strings.HasPrefix(uuid, "MIG-") {
		t.Errorf("daemon started with %q, want the MIG device %s", starts, uuid)
	}
	if mode, _ := e.nvml.ComputeMode(e.gpuOf(devs[0].DeviceName).PCIBusID); mode != nvml.ComputeDefault {
		t.Errorf("compute mode %s", mode)
	}
	e.unprepare(c)
	if after := e.hwState(); after != before {
		t.Errorf("after unprepare:\n%s\nwant\n%s", after, before)
	}
}

// A running claim keeps its MPS daemon when the agent restarts: the new
// agent adopts it, and its unprepare stops it.
func TestMPSSurvivesRestart(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	c := e.claim(request{name: "gpu", cel: `profile == "full"`, config: sharingConfig(`{"strategy": "MPS"}`)})
	e.mustPrepare(c)
	id := e.onlyDaemon()
	running := e.mpsProcesses()
	e.restart(nil)
	if err := e.driver.MPS().Check(context.Background(), id); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if got := e.mpsProcesses(); !slices.Equal(got, running) {
		t.Errorf("daemons %v after the restart, were %v", got, running)
	}
	if down := e.driver.MPS().Supervise(context.Background()); len(down) != 0 {
		t.Errorf("down after the restart: %v", down)
	}
	if starts, _ := e.daemonLog(id); len(starts) != 1 {
		t.Errorf("daemon started %d times", len(starts))
	}
	e.unprepare(c)
	if got := e.mpsProcesses(); len(got) != 0 {
		t.Errorf("daemons after unprepare: %v", got)
	}
}

// A daemon no prepared claim uses (the claim's records lost while the
// agent was down) is kept while the claim is allocated to the node and
// stopped once it is not.
func TestReclaimMPS(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	c := e.claim(request{name: "gpu", cel: `profile == "full"`, config: sharingConfig(`{"strategy": "MPS"}`)})
	e.mustPrepare(c)
	e.allocated = func(context.Context) ([]*resourceapi.ResourceClaim, error) {
		return []*resourceapi.ResourceClaim{c}, nil
	}
	for _, f := range []string{"state/" + DriverName + ".checkpoint.json", "state/" + DriverName + ".checkpoint.json.1"} {
		os.Remove(filepath.Join(e.dir, f))
	}
	specs, _ := filepath.Glob(filepath.Join(e.dir, "cdi", "*"))
	for _, s := range specs {
		os.Remove(s)
	}
	e.restart(nil)
	if got := e.mpsProcesses(); len(got) != 1 {
		t.Fatalf("the allocated claim's daemon was not kept: %v", got)
	}
	// The claim is deleted: nothing is allocated to the node any more.
	if _, err := e.driver.Reclaim(context.Background(), prepare.Allocated{Known: true}); err != nil {
		t.Fatal(err)
	}
	if got := e.mpsProcesses(); len(got) != 0 || len(e.driver.MPS().IDs()) != 0 {
		t.Errorf("daemons %v (recorded %v) once no claim may use them", got, e.driver.MPS().IDs())
	}
	if mode, _ := e.nvml.ComputeMode("0000:1b:00.0"); mode != nvml.ComputeDefault {
		t.Errorf("compute mode %s once nothing uses the GPU", mode)
	}
}

// A sharing strategy a device cannot take, and bad settings, fail the
// prepare naming the claim, the request and the field, with nothing
// started or changed.
func TestSharingRefused(t *testing.T) {
	mpsCfg := sharingConfig(`{"strategy": "MPS"}`)
	for _, tc := range []struct {
		name, profile string
		reqs          []request
		want          []string
	}{
		{"MPS on a vGPU", "h100-vgpu", []request{{name: "v", cel: `profile == "H100-10C"`, config: mpsCfg}},
			[]string{`request "v"`, `sharing.strategy: Invalid value: "MPS": a vGPU takes no sharing strategy`}},
		{"time slicing a MIG partition", "h100-mig", []request{{name: "m", cel: `profile == "1g.10gb"`, config: sharingConfig(`{"strategy": "TimeSlicing"}`)}},
			[]string{`request "m"`, `sharing.strategy: Invalid value: "TimeSlicing": the time slice is a setting of the whole GPU`}},
		{"a memory limit larger than the GPU", "gpus: [{model: h100-80gb, count: 1}]",
			[]request{{name: "g", cel: `profile == "full"`, config: sharingConfig(`{"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "100Gi"}}`)}},
			[]string{`request "g"`, `sharing.mps.defaultPinnedDeviceMemoryLimit: Invalid value: "100Gi": more than the device's`}},
		{"a memory limit larger than the MIG partition", "h100-mig",
			[]request{{name: "m", cel: `profile == "1g.10gb"`, config: sharingConfig(`{"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "11Gi"}}`)}},
			[]string{`sharing.mps.defaultPinnedDeviceMemoryLimit`}},
		{"two MPS settings in a claim", "gpus: [{model: h100-80gb, count: 2}]", []request{
			{name: "a", cel: `profile == "full"`, config: mpsCfg},
			{name: "b", cel: `profile == "full"`, config: sharingConfig(`{"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 10}}`)},
		}, []string{`requests "a" and "b": their MPS settings differ`}},
		{"a GPU beside MPS", "gpus: [{model: h100-80gb, count: 2}]", []request{
			{name: "a", cel: `profile == "full"`, config: mpsCfg}, {name: "b", cel: `profile == "full"`},
		}, []string{`request "b"`, `does not run under MPS beside request "a"'s`}},
		{"an unknown sharing field", "gpus: [{model: h100-80gb, count: 1}]",
			[]request{{name: "g", cel: `profile == "full"`, config: sharingConfig(`{"strategy": "MPS", "mps": {"threads": 5}}`)}},
			[]string{`unknown field "sharing.mps.threads"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.profile, false)
			before := e.hwState()
			c := e.claim(tc.reqs...)
			_, err := e.prepare(c)
			if err == nil {
				t.Fatal("prepare succeeded")
			}
			for _, want := range append(tc.want, "default/"+c.Name) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			e.wantAsBefore(t, before, "after the refused prepare")
		})
	}
}

// Independent claims share one GPU: each runs under the GPU's one MPS
// daemon, held to what it consumed; the GPU is exclusive to the daemon
// while a share is prepared; the daemon stops, and the GPU comes back,
// with the last share.
func TestGPUShares(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1}]", true)
	before := e.hwState()
	small, large := e.claim(shareOf("s", "10Gi", "40")), e.claim(shareOf("s", "20Gi", "40"))
	devs := map[*resourceapi.ResourceClaim][]kubeletplugin.Device{}
	for _, c := range []*resourceapi.ResourceClaim{small, large} {
		devs[c] = e.mustPrepare(c)
		if d, r := devs[c][0], c.Status.Allocation.Devices.Results[0]; d.ShareID == nil || *d.ShareID != *r.ShareID {
			t.Errorf("%s: share %v, allocated %v", c.Name, d.ShareID, r.ShareID)
		}
	}
	id := e.onlyDaemon()
	g := e.gpus[0]
	starts, told := e.daemonLog(id)
	if !slices.Equal(starts, []string{g.UUID}) || len(told) != 0 {
		t.Errorf("the GPU's daemon started %q, told %q; want one start on %s and no defaults", starts, told, g.UUID)
	}
	if mode, _ := e.nvml.ComputeMode(g.PCIBusID); mode != nvml.ComputeExclusiveProcess {
		t.Errorf("compute mode %s under shares", mode)
	}
	dirs := e.driver.MPS().Dirs(id)
	for c, limit := range map[*resourceapi.ResourceClaim]string{small: "0=10240M", large: "0=20480M"} {
		spec := e.inject(devs[c])
		env := envOf(spec)
		if env[mps.ActiveThreadPercentageEnv] != "40" || env[mps.PinnedMemoryLimitEnv] != limit || env[mps.PipeDirEnv] != mps.ContainerPipeDir {
			t.Errorf("%s: container env %v, want 40%% and %s", c.Name, env, limit)
		}
		if !slices.ContainsFunc(spec.Mounts, func(m oci.Mount) bool { return m.Source == dirs.Pipe && m.Destination == mps.ContainerPipeDir }) {
			t.Errorf("%s: the GPU's pipe directory is not mounted: %+v", c.Name, spec.Mounts)
		}
	}
	e.unprepare(small)
	if err := e.driver.MPS().Check(context.Background(), id); err != nil {
		t.Fatalf("the daemon after one of two shares went: %v", err)
	}
	if mode, _ := e.nvml.ComputeMode(g.PCIBusID); mode != nvml.ComputeExclusiveProcess {
		t.Errorf("compute mode %s with a share left", mode)
	}
	e.unprepare(large)
	if after := e.hwState(); after != before {
		t.Errorf("after the last share:\n%s\nwant\n%s", after, before)
	}
}

// What a share consumed is checked against the GPU, and a share takes no
// sharing strategy and nothing beside it in its claim.
func TestGPUShareRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		reqs   []request
		tamper func(*resourceapi.ResourceClaim)
		want   []string
	}{
		{"a sharing strategy", []request{func() request {
			r := shareOf("s", "1Gi", "10")
			r.config = sharingConfig(`{"strategy": "TimeSlicing"}`)
			return r
		}()}, nil, []string{`sharing.strategy: Invalid value: "TimeSlicing": a GPU share takes no sharing strategy`}},
		{"compute 0", []request{shareOf("s", "1Gi", "10")}, func(c *resourceapi.ResourceClaim) {
			c.Status.Allocation.Devices.Results[0].ConsumedCapacity[device.GPUCapCompute] = resource.MustParse("0")
		}, []string{`consumedCapacity[gpu.hwdra.io/compute]: Invalid value: "0": must be 1 to 100`}},
		{"compute above 100", []request{shareOf("s", "1Gi", "10")}, func(c *resourceapi.ResourceClaim) {
			c.Status.Allocation.Devices.Results[0].ConsumedCapacity[device.GPUCapCompute] = resource.MustParse("150")
		}, []string{`consumedCapacity[gpu.hwdra.io/compute]: Invalid value: "150"`}},
		{"more memory than the GPU", []request{shareOf("s", "1Gi", "10")}, func(c *resourceapi.ResourceClaim) {
			c.Status.Allocation.Devices.Results[0].ConsumedCapacity[device.GPUCapMemory] = resource.MustParse("100Gi")
		}, []string{`consumedCapacity[gpu.hwdra.io/memory]: Invalid value: "100Gi": must be at least 1 byte and at most the GPU's`}},
		{"no share ID", []request{shareOf("s", "1Gi", "10")}, func(c *resourceapi.ResourceClaim) {
			c.Status.Allocation.Devices.Results[0].ShareID = nil
		}, []string{"without a share ID"}},
		{"a GPU beside the share", []request{shareOf("s", "1Gi", "10"), {name: "g", cel: `profile == "full"`}}, nil,
			[]string{`a claim with a GPU share has no other device`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "gpus: [{model: h100-80gb, count: 2}]", false)
			before := e.hwState()
			c := e.claim(tc.reqs...)
			if tc.tamper != nil {
				tc.tamper(c)
			}
			_, err := e.prepare(c)
			if err == nil {
				t.Fatal("prepare succeeded")
			}
			for _, want := range append(tc.want, "default/"+c.Name) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if got := e.hwState(); got != before {
				t.Errorf("hardware touched:\n%s\nwas\n%s", got, before)
			}
		})
	}
}
