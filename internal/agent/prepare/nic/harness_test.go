// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
	"github.com/hwdra/hwdra/internal/mock/nicsim"
	"github.com/hwdra/hwdra/internal/state"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

const (
	testNode = "worker-1"
	testBoot = "boot-1"
)

// env is a mock node with the real sriov backend over it, the scheduler's
// allocator over its published NIC slices, and a plugin on a state dir.
type env struct {
	t      testing.TB
	hw     *mock.Hardware
	vfs    *nicsim.VFRecorder
	dir    string
	pfs    []hw.PF // what the node publishes (Current)
	cfg    *config.AgentConfig
	alloc  *allocate.Allocator
	driver *Driver
	plugin *prepare.Plugin[Record]
	// initial is the VFs' state before any claim.
	initial map[string]hw.VFConfig
}

// cx7Node: one ConnectX-7 PF at 400G with 16 VFs (RDMA on every VF).
const cx7Node = `nics: [{model: cx7, count: 1, vfs: 16, pciAddresses: ["0000:17:00.0"], netdevs: [pfa]}]`

// agentHeader starts an AgentConfig file.
const agentHeader = "apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\n"

// openPolicy lets claims set every VF setting: the tests of applying
// them use it; the policy's own tests (TestTenant...) give theirs.
const openPolicy = "vfPolicy: {allowedVLANs: [\"0-4094\"], allowTrust: true, allowSpoofCheckOff: true, allowMAC: true, allowGUIDs: true}\n"

// permissive is the default configuration (every PF shared) with
// openPolicy.
func permissive(t testing.TB) *config.AgentConfig {
	t.Helper()
	cfg, err := config.Parse([]byte(agentHeader + openPolicy))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// newEnv builds the node from a mock profile and an agent configuration
// ("" for the default, every PF shared, with openPolicy) and starts a
// plugin.
func newEnv(t testing.TB, profile, agentConfig string) *env {
	t.Helper()
	h, pfs := openNode(t, profile)
	cfg := permissive(t)
	if agentConfig != "" {
		var err error
		if cfg, err = config.Parse([]byte(agentConfig)); err != nil {
			t.Fatal(err)
		}
	}
	offers, _ := cfg.Resolve(pfs)
	res, skips := resources.NIC(testNode, offers, device.AllFeatures)
	if len(skips) > 0 {
		t.Fatalf("skips: %v", skips)
	}
	var objs []*resourceapi.ResourceSlice
	for _, s := range resources.Objects(device.NICDriver, testNode, res) {
		objs = append(objs, &s)
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: device.NICDriver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", device.NICDriver)}}}}}
	e := &env{t: t, hw: h, vfs: h.NICs().VFConfigurator(), dir: t.TempDir(), pfs: pfs, cfg: cfg,
		alloc: allocate.New(allocate.ClusterFeatures, testNode, objs, []*resourceapi.DeviceClass{class})}
	e.initial = e.vfs.Snapshot()
	e.start()
	return e
}

// openNode builds mock hardware from a profile and discovers its PFs.
func openNode(t testing.TB, profile string) (*mock.Hardware, []hw.PF) {
	t.Helper()
	h := mocktest.Open(t, profile)
	pfs, err := sriov.Discover(sriov.Options{SysfsRoot: h.Sysfs, Routes: h.NICs(), Eswitch: h.NICs()})
	if err != nil {
		t.Fatal(err)
	}
	return h, pfs
}

// Current is what the node publishes: the env's PFs, every feature.
func (e *env) Current() (hw.Inventory, device.Features) {
	return hw.Inventory{PFs: e.pfs}, device.AllFeatures
}

// newDriver is a driver over the env's hardware and state dir.
func (e *env) newDriver() *Driver {
	e.t.Helper()
	d, err := New(Options{
		VFs:       e.vfs,
		Published: e, Config: e.cfg,
		SysfsRoot: e.hw.Sysfs, DevRoot: e.hw.DevRoot(), StateDir: e.stateDir(),
		NodeName: testNode, BootID: testBoot,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

// start (re)starts the agent: a fresh driver and plugin on the state dir,
// as after a crash.
func (e *env) start() {
	e.t.Helper()
	e.driver = e.newDriver()
	p, err := prepare.New[Record](context.Background(), e.driver, prepare.Options{
		DriverName: device.NICDriver, StateDir: e.stateDir(), CDIDir: e.cdiDir(), BootID: testBoot,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.plugin = p
}

func (e *env) stateDir() string { return filepath.Join(e.dir, "state") }
func (e *env) cdiDir() string   { return filepath.Join(e.dir, "cdi") }

var claimSeq atomic.Int64

// claim is a claim of NIC requests with optional opaque VfConfig
// parameters for all of them (JSON without apiVersion/kind).
func newClaim(vfConfig string, reqs ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	n := claimSeq.Add(1)
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", n), Namespace: "ns", UID: types.UID(fmt.Sprintf("uid-%d", n))},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}},
	}
	if vfConfig != "" {
		raw := `{"apiVersion": "sriov.hwdra.io/v1alpha1", "kind": "VfConfig"` + vfConfig + `}`
		c.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: device.NICDriver, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}}}
	}
	return c
}

// share requests a bandwidth share ("" for the policy's default).
func share(name, bw string) resourceapi.DeviceRequest {
	r := vfRequest(name)
	if bw != "" {
		r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			device.NICCapBandwidth: resource.MustParse(bw)}}
	}
	return r
}

// vfRequest asks for one device of the driver (exclusive PFs have only VFs).
func vfRequest(name string) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: device.NICDriver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}
}

// allocate runs the scheduler's allocator on the claim; it must fit.
func (e *env) allocate(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	e.t.Helper()
	if err := e.alloc.Allocate(context.Background(), c); err != nil {
		e.t.Fatalf("allocate %s: %v", c.Name, err)
	}
	return c
}

func (e *env) prepare(c *resourceapi.ResourceClaim) (kubeletplugin.PrepareResult, error) {
	res, err := e.plugin.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil {
		return kubeletplugin.PrepareResult{}, err
	}
	return res[c.UID], res[c.UID].Err
}

func (e *env) mustPrepare(c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	e.t.Helper()
	r, err := e.prepare(c)
	if err != nil {
		e.t.Fatalf("prepare %s: %v", c.Name, err)
	}
	return r
}

func (e *env) unprepare(c *resourceapi.ResourceClaim) error {
	res, err := e.plugin.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: c.UID}})
	return errors.Join(err, res[c.UID])
}

// record is the claim's record in the checkpoint.
func (e *env) record(c *resourceapi.ResourceClaim) Record {
	e.t.Helper()
	raw, err := readCheckpointRecord(filepath.Join(e.stateDir(), device.NICDriver+".checkpoint.json"), c.UID)
	if err != nil {
		e.t.Fatal(err)
	}
	return raw
}

// checkPristine: every VF as before any claim, none held, ledger empty.
func (e *env) checkPristine() {
	e.t.Helper()
	if got := e.vfs.Snapshot(); !reflect.DeepEqual(got, e.initial) {
		for k, v := range got {
			if !reflect.DeepEqual(v, e.initial[k]) {
				e.t.Errorf("VF %s: %+v, was %+v", k, v, e.initial[k])
			}
		}
	}
	if held := e.driver.Held(); len(held) > 0 {
		e.t.Errorf("VFs still held: %v", held)
	}
	if keys := e.driver.ledger.Keys(); len(keys) > 0 {
		e.t.Errorf("ledger still lists %v", keys)
	}
}

// readCheckpointRecord reads one claim's record from the checkpoint file
// as an outside reader (the NRI step) would.
func readCheckpointRecord(path string, uid types.UID) (Record, error) {
	var cp struct {
		Claims map[types.UID]struct {
			Record Record `json:"record"`
		} `json:"claims"`
	}
	raw, err := state.Read(path, state.CheckpointFormat)
	if err != nil {
		return Record{}, err
	}
	if err := json.Unmarshal(raw, &cp); err != nil {
		return Record{}, err
	}
	c, ok := cp.Claims[uid]
	if !ok {
		return Record{}, fmt.Errorf("claim %s not in the checkpoint", uid)
	}
	return c.Record, nil
}
