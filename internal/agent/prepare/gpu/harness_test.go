// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
	"github.com/hwdra/hwdra/internal/backend/driverlibs"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/backend/vfiopci"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock"
	"github.com/hwdra/hwdra/internal/mock/drivertools"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
	"github.com/hwdra/hwdra/internal/state"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

const testNode = "worker-1"

// env is one node: mock hardware driven through the real nvml backend,
// a state directory, a CDI directory, and the agent's plugin over them.
type env struct {
	t    testing.TB
	hw   *mock.Hardware
	nvml *nvml.Backend
	dir  string
	gpus []hw.GPU // the inventory the agent scanned
	// passthrough are the GPUs bound to vfio-pci it scanned.
	passthrough []hw.PassthroughGPU
	alloc       *allocate.Allocator
	driver      *Driver
	plugin      *prepare.Plugin[Record]
	seq         int
	// allocated, when set, is what the API server says is allocated
	// (prepare.Options.Allocated); nil: no API server.
	allocated func(context.Context) ([]*resourceapi.ResourceClaim, error)
	// settings is the driver's gpus.settings (empty: Manage); set it with
	// restartWith. The allocator's slices are always Manage's: a claim
	// may have been allocated before the setting changed.
	settings config.GPUSettings
	// noIOMMU is the driver's vfio.allowUnsafeNoIOMMU; set it, then
	// restart.
	noIOMMU bool
	// ctx is what prepare and unprepare run with (a test's logger); nil:
	// context.Background().
	ctx context.Context
}

// newEnv builds mock hardware from a built-in profile name or a "gpus:"
// snippet, and starts the plugin. A node-wide NVIDIA CDI spec is written
// unless noDriverSpec.
func newEnv(t testing.TB, profile string, driverSpec bool) *env {
	t.Helper()
	dir := t.TempDir() // state and CDI directories: on disk, fsync and all
	// The mock's sysfs, procfs and /dev stand for in-memory file systems:
	// on tmpfs where there is one (a vGPU host's sysfs has thousands of
	// files, slow to create on a disk).
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() && unix.Access("/dev/shm", unix.W_OK) == nil {
		t.Setenv("TMPDIR", "/dev/shm")
	}
	h := mocktest.Open(t, profile)
	b := nvml.New(h.NVML, nvml.WithSysfs(h.Sysfs))
	if err := b.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Shutdown() })
	e := &env{t: t, hw: h, nvml: b, dir: dir}
	if driverSpec {
		writeDriverSpec(t, filepath.Join(e.dir, "etc-cdi"))
	}
	e.rescan()
	classes := []*resourceapi.DeviceClass{{
		ObjectMeta: metav1.ObjectMeta{Name: DriverName},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", DriverName)},
		}}},
	}}
	var objs []*resourceapi.ResourceSlice
	for _, s := range resources.Objects(DriverName, testNode, resources.TaintedGPU(testNode, e.gpus, e.passthrough, device.AllFeatures, resources.Health{}, config.GPUPolicy{})) {
		objs = append(objs, &s)
	}
	e.alloc = allocate.New(allocate.ClusterFeatures, testNode, objs, classes)
	e.restart(nil)
	return e
}

// rescan refreshes the inventory, as the agent's periodic scan does.
func (e *env) rescan() {
	gpus, err := e.nvml.GPUs(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	e.gpus = gpus
	scanner, err := vfiopci.New(e.hw.Sysfs)
	if err == nil {
		e.passthrough, err = scanner.GPUs()
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

// restart builds a fresh driver and plugin on the same state directory and
// hardware, as an agent restart does.
func (e *env) restart(hook func(string) error) {
	e.t.Helper()
	d, err := New(Options{
		NVML:      e.nvml,
		NodeName:  testNode,
		Published: e,
		StateDir:  filepath.Join(e.dir, "state"),
		DevRoot:   e.hw.DevRoot(),
		ProcRoot:  e.hw.ProcRoot(),
		SysfsRoot: e.hw.Sysfs,
		Sysfs:     e.hw.SysfsWriter(),
		// The toolkit's spec alone (no NVML: nothing generated), so that
		// tests see the spec's files; driver_files_test.go generates.
		DriverFiles:        driverlibs.New(driverlibs.Options{SpecDirs: []string{filepath.Join(e.dir, "etc-cdi"), filepath.Join(e.dir, "cdi")}}),
		Programs:           nvml.Programs{Bin: e.hw.DriverBin()},
		Settings:           e.settings,
		AllowUnsafeNoIOMMU: e.noIOMMU,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	d.afterEffect = hook
	ctx, cancel := context.WithCancel(context.Background())
	e.t.Cleanup(cancel) // the plugin's background reclaim
	p, err := prepare.New[Record](ctx, d, prepare.Options{
		DriverName: DriverName, StateDir: filepath.Join(e.dir, "state"), CDIDir: filepath.Join(e.dir, "cdi"), BootID: "boot-1",
		Cluster: e.cluster(), ReclaimInterval: 10 * time.Millisecond,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.driver, e.plugin = d, p
}

// restartWith restarts the agent with another gpus.settings, as an
// operator's configuration change does.
func (e *env) restartWith(settings config.GPUSettings) {
	e.t.Helper()
	e.settings = settings
	e.restart(nil)
}

// context is what the plugin's calls run with.
func (e *env) context() context.Context {
	if e.ctx != nil {
		return e.ctx
	}
	return context.Background()
}

// Current is what the node publishes: the env's GPUs, every feature.
func (e *env) Current() (hw.Inventory, device.Features) {
	return hw.Inventory{GPUs: e.gpus, PassthroughGPUs: e.passthrough}, device.AllFeatures
}

// cluster is the API server as the env's allocated says it; nil without.
func (e *env) cluster() prepare.Cluster {
	if e.allocated == nil {
		return nil
	}
	return e
}

// AllocatedClaims implements prepare.Cluster.
func (e *env) AllocatedClaims(ctx context.Context) ([]*resourceapi.ResourceClaim, error) {
	return e.allocated(ctx)
}

// request asks for one device matching a CEL expression on the driver's
// attributes, e.g. `profile == "1g.10gb"`.
type request struct {
	name, cel string
	config    string // opaque GpuConfig parameters, JSON
	admin     bool   // adminAccess
	// capacity requests, by name ("gpu.hwdra.io/compute": "40")
	capacity map[resourceapi.QualifiedName]string
	// class is the DeviceClass asked for (the env's allocator must know
	// it: allocator.AddClasses); empty: gpu.hwdra.io, all of the driver's
	// devices.
	class string
}

// claim allocates a claim of the requests with the scheduler's allocator.
func (e *env) claim(reqs ...request) *resourceapi.ResourceClaim {
	e.t.Helper()
	e.seq++
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{
		Namespace: "default", Name: fmt.Sprintf("claim-%d", e.seq), UID: types.UID(fmt.Sprintf("uid-%d", e.seq)),
	}}
	for _, r := range reqs {
		class := r.class
		if class == "" {
			class = DriverName
		}
		dr := resourceapi.DeviceRequest{Name: r.name, Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		}}
		if r.cel != "" {
			dr.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.attributes["gpu.hwdra.io"].` + r.cel,
			}}}
		}
		if r.admin {
			dr.Exactly.AdminAccess = &r.admin
		}
		if len(r.capacity) > 0 {
			dr.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
			for name, v := range r.capacity {
				dr.Exactly.Capacity.Requests[name] = resource.MustParse(v)
			}
		}
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, dr)
		if r.config != "" {
			c.Spec.Devices.Config = append(c.Spec.Devices.Config, resourceapi.DeviceClaimConfiguration{
				Requests: []string{r.name},
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
					Driver: DriverName, Parameters: runtime.RawExtension{Raw: []byte(r.config)},
				}},
			})
		}
	}
	if err := e.alloc.Allocate(context.Background(), c); err != nil {
		e.t.Fatalf("allocate %v: %v", reqs, err)
	}
	return c
}

func (e *env) prepare(c *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	res, err := e.plugin.PrepareResourceClaims(e.context(), []*resourceapi.ResourceClaim{c})
	if err != nil {
		return nil, err
	}
	return res[c.UID].Devices, res[c.UID].Err
}

func (e *env) mustPrepare(c *resourceapi.ResourceClaim) []kubeletplugin.Device {
	e.t.Helper()
	devs, err := e.prepare(c)
	if err != nil {
		e.t.Fatalf("prepare %s: %v", c.Name, err)
	}
	return devs
}

func (e *env) unprepare(c *resourceapi.ResourceClaim) {
	e.t.Helper()
	res, err := e.plugin.UnprepareResourceClaims(e.context(), []kubeletplugin.NamespacedObject{{
		NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID,
	}})
	if err == nil {
		err = res[c.UID]
	}
	if err != nil {
		e.t.Fatalf("unprepare %s: %v", c.Name, err)
	}
}

// hwState is what a test compares before and after: GPU instances, MIG
// modes, compute modes and time slices, mediated devices and MPS control
// daemons (recorded or running) of the node.
func (e *env) hwState() string {
	e.t.Helper()
	var b strings.Builder
	for _, g := range e.gpus {
		on, err := e.nvml.MIGEnabled(g.PCIBusID)
		if err != nil {
			e.t.Fatal(err)
		}
		list, err := e.nvml.GPUInstances(g.PCIBusID)
		if err != nil {
			e.t.Fatal(err)
		}
		mode, err := e.nvml.ComputeMode(g.PCIBusID)
		if err != nil {
			e.t.Fatal(err)
		}
		slice, err := e.hw.TimeSlice(g.PCIBusID)
		if err != nil {
			e.t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s compute=%s slice=%d\n", g.PCIBusID, mode, slice)
		fmt.Fprintf(&b, "%s mig=%v", g.PCIBusID, on)
		for _, gi := range list {
			fmt.Fprintf(&b, " gi(profile %d at %d, %d CIs)", gi.ProfileID, gi.Placement.Start, len(gi.ComputeInstances))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "mdevs %v\nvGPU VFs %v\nMPS daemons recorded %v, running %v", e.hw.MdevUUIDs(), e.hw.VGPUVFs(), e.driver.MPS().IDs(), e.mpsProcesses())
	return b.String()
}

// mpsProcesses are the running MPS control daemons of this env (by their
// pipe directory under its state directory), by pipe directory.
func (e *env) mpsProcesses() []string {
	e.t.Helper()
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range procs {
		cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
		if !strings.HasPrefix(string(cmdline), drivertools.MPSControl+"\x00-f") {
			continue
		}
		environ, _ := os.ReadFile(p)
		for _, v := range strings.Split(string(environ), "\x00") {
			if pipe, ok := strings.CutPrefix(v, mps.PipeDirEnv+"="); ok && strings.HasPrefix(pipe, e.dir) {
				out = append(out, strings.TrimPrefix(pipe, e.dir))
			}
		}
	}
	slices.Sort(out)
	return out
}

// inject loads the CDI directory into a fresh cache and injects the
// devices into an OCI spec, as a container runtime does.
func (e *env) inject(devs []kubeletplugin.Device) *oci.Spec {
	e.t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(filepath.Join(e.dir, "cdi")), cdi.WithAutoRefresh(false))
	if err != nil {
		e.t.Fatal(err)
	}
	for path, errs := range cache.GetErrors() {
		if len(errs) > 0 {
			e.t.Fatalf("CDI spec %s: %v", path, errs)
		}
	}
	var ids []string
	for _, d := range devs {
		ids = append(ids, d.CDIDeviceIDs...)
	}
	spec := &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"}}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		e.t.Fatalf("inject %v: %v (unresolved %v)", ids, err, unresolved)
	}
	return spec
}

// wantAsBefore: the hardware is as it was before (hwState) and the
// ledger empty: nothing left behind. when says at which point.
func (e *env) wantAsBefore(t *testing.T, before, when string) {
	t.Helper()
	if got := e.hwState(); got != before {
		t.Errorf("%s: hardware\n%s\nwant\n%s", when, got, before)
	}
	if keys := e.ledgerKeys(); len(keys) != 0 {
		t.Errorf("%s: ledger %v", when, keys)
	}
}

// ledgerKeys reads the driver's ledger file.
func (e *env) ledgerKeys() []string {
	raw, err := state.Read(e.driver.ledger.Path(), state.LedgerFormat)
	if err == nil && raw == nil {
		return nil
	}
	var entries map[string]json.RawMessage
	if err == nil {
		err = json.Unmarshal(raw, &entries)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	var keys []string
	for k := range entries {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// checkpointRecord reads a claim's record from the checkpoint file.
func (e *env) checkpointRecord(uid types.UID) (Record, bool) {
	raw, err := state.Read(filepath.Join(e.dir, "state", DriverName+".checkpoint.json"), state.CheckpointFormat)
	if err != nil {
		e.t.Fatal(err)
	}
	var cp struct {
		Claims map[types.UID]struct {
			State  string `json:"state"`
			Record Record `json:"record"`
		} `json:"claims"`
	}
	if err := json.Unmarshal(raw, &cp); err != nil {
		e.t.Fatal(err)
	}
	c, ok := cp.Claims[uid]
	return c.Record, ok
}

// writeDriverSpec writes what `nvidia-ctk cdi generate` writes, trimmed:
// devices plus spec-level edits with a library mount, an ldcache hook and
// a control device node.
func writeDriverSpec(t testing.TB, dir string) {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	const spec = `cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
      type: c
      major: 195
      minor: 0
containerEdits:
  env:
  - NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu
  - NVIDIA_VISIBLE_DEVICES=all
  deviceNodes:
  - path: /dev/nvidia-modeset
    type: c
    major: 195
    minor: 254
  - path: /dev/nvidiactl
    type: c
    major: 195
    minor: 255
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options: [ro, nosuid, nodev, bind]
`
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
}

// shareOf asks for a GPU share of memory and compute ("10Gi", "40").
func shareOf(name, memory, compute string) request {
	return request{name: name, cel: `type == "share"`, capacity: map[resourceapi.QualifiedName]string{
		device.GPUCapMemory: memory, device.GPUCapCompute: compute,
	}}
}

// dedicatedShareOf asks for a dedicated GPU share (GpuConfig
// share.isolation Dedicated in the claim).
func dedicatedShareOf(name, memory, compute string) request {
	r := shareOf(name, memory, compute)
	r.config = shareConfig(`{"isolation": "Dedicated"}`)
	return r
}

// shareConfig is a GpuConfig with share settings, JSON.
func shareConfig(share string) string {
	return `{"apiVersion": "gpu.hwdra.io/v1alpha1", "kind": "GpuConfig", "share": ` + share + `}`
}

// sharingConfig is a GpuConfig with a sharing strategy, JSON.
func sharingConfig(sharing string) string {
	return `{"apiVersion": "gpu.hwdra.io/v1alpha1", "kind": "GpuConfig", "sharing": ` + sharing + `}`
}
