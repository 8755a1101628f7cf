// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package gpu is the gpu.hwdra.io side of prepare: it turns allocated GPU
// devices (whole GPUs, MIG partitions, vGPUs) into hardware state and CDI
// container edits, recording every side effect so that a failed or
// interrupted prepare is undone and nothing leaks.
package gpu

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
	"github.com/hwdra/hwdra/internal/backend/driverlibs"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/keyedlock"
	"github.com/hwdra/hwdra/internal/state"
)

// DriverName is the driver this package prepares devices of.
const DriverName = device.GPUDriver

// DriverFiles gives a GPU container the NVIDIA driver's files
// (driverlibs.Libraries): the edits (nil where there are none) and where
// they come from.
type DriverFiles interface {
	Edits(ctx context.Context) (*cdispec.ContainerEdits, driverlibs.Source)
}

// Options configure a Driver. Roots default to the host's.
type Options struct {
	// NVML is the initialised GPU backend; nil on a node whose only GPUs
	// are bound to vfio-pci (passthrough), which need none.
	NVML *nvml.Backend
	// NodeName is the node, and so the name of its pool: prepare refuses
	// a device allocated from another pool.
	NodeName string
	// Published is what the node publishes now: its GPUs (NVML's and
	// those bound to vfio-pci) and the features the slices were built
	// with. Prepare looks devices up in the catalog they give
	// (resources.GPUDevices). It may be the agent's last scan: prepare
	// checks MIG mode, instances and VFs on the live hardware itself.
	Published prepare.Published
	// StateDir holds the ledger of GPU instances and mediated devices the
	// agent made ("gpu.hwdra.io.ledger.json").
	StateDir string
	// DevRoot is where the host's device nodes are ("/dev"), ProcRoot its
	// procfs ("/proc"), SysfsRoot its sysfs ("/sys").
	DevRoot, ProcRoot, SysfsRoot string
	// DevNodeRoot is DevRoot as the node names it, for the host paths in
	// CDI specs (the runtime reads them on the node): they differ where
	// the agent runs in a container and sees a driver root's dev/ at
	// another path. Empty: DevRoot.
	DevNodeRoot string
	// Sysfs writes sysfs attributes (creating and removing mediated
	// devices, setting VFs' vGPU types); nil writes files under SysfsRoot.
	Sysfs nvml.SysfsWriter
	// DriverFiles gives each GPU container the NVIDIA driver's files
	// (libraries, programs, hooks); nil: containers get device nodes
	// only.
	DriverFiles DriverFiles
	// Programs are the NVIDIA driver's programs: nvidia-smi sets time
	// slices, nvidia-cuda-mps-control runs MPS.
	Programs nvml.Programs
	// MPSCgroup is where MPS control daemons' processes go: beside the
	// agent's pod where it runs in one.
	MPSCgroup mps.Cgroup
	// MPSShmSize and MPSMemoryLimit size each MPS daemon's shared memory
	// and its cgroup's memory limit, in bytes (gpus.mps); 0: the
	// defaults.
	MPSShmSize, MPSMemoryLimit int64
	// Settings is gpus.settings (config.GPUPolicy.Settings): under Leave
	// prepare never changes a GPU's MIG mode, compute mode or time slice.
	// Empty: Manage.
	Settings config.GPUSettings
	// AllowUnsafeNoIOMMU hands out VFIO groups of a kernel that runs VFIO
	// without an IOMMU (vfio.allowUnsafeNoIOMMU); false refuses a claim
	// for a device in one.
	AllowUnsafeNoIOMMU bool
}

// Driver prepares gpu.hwdra.io devices; it implements prepare.Driver.
type Driver struct {
	nvml      *nvml.Backend
	node      string
	published prepare.Published
	mdevs     *nvml.Mdevs
	vfs       *nvml.VFVGPUs
	sysfs     string
	ledger    *state.Ledger[ledgerEntry]
	nodes     nodeResolver
	files     DriverFiles
	programs  nvml.Programs
	mps       *mps.Manager
	// leave: gpus.settings is Leave (Options.Settings).
	leave bool
	// noIOMMU: Options.AllowUnsafeNoIOMMU.
	noIOMMU bool

	gpuLocks keyedlock.Locks
	mu       sync.Mutex
	// cat caches the catalog of the last inventory.
	cat struct {
		gpus        []hw.GPU
		passthrough []hw.PassthroughGPU
		features    device.Features
		devices     map[string]resources.GPUDevice
	}
	// owners maps the ledger key of each GPU instance a prepared claim
	// uses (created or static) to that claim.
	owners map[string]types.UID
	// users are the claims that use each GPU (by PCI bus ID).
	users map[string]map[types.UID]bool
	// mpsUsers are the claims that use each MPS daemon (by ID).
	mpsUsers map[string]map[types.UID]bool
	// reconciled: users and owners know every prepared claim (Reconcile
	// ran). Until then MIG modes are left alone: a claim rolled back at
	// start may share its GPU with claims not yet known.
	reconciled bool
	// toldMPSMode are the GPUs whose compute mode under MPS the log has
	// explained (Default under gpus.settings Leave, or for a dedicated
	// share): once per GPU.
	toldMPSMode map[string]bool

	// afterEffect, when set (tests), runs right after each side effect
	// succeeds, before its result is recorded; an error fails the prepare
	// there.
	afterEffect func(what string) error
}

var _ prepare.Driver[Record] = (*Driver)(nil)

// New returns a Driver. It touches no hardware.
func New(opts Options) (*Driver, error) {
	if opts.Published == nil || opts.NodeName == "" {
		return nil, errors.New("gpu: Published and NodeName are required")
	}
	switch opts.Settings {
	case "", config.SettingsManage, config.SettingsLeave:
	default:
		return nil, fmt.Errorf("gpu: Settings %q: want %s or %s", opts.Settings, config.SettingsManage, config.SettingsLeave)
	}
	for _, r := range []struct {
		root *string
		def  string
	}{{&opts.DevRoot, "/dev"}, {&opts.ProcRoot, "/proc"}, {&opts.SysfsRoot, "/sys"}} {
		if *r.root == "" {
			*r.root = r.def
		}
	}
	if opts.DevNodeRoot == "" {
		opts.DevNodeRoot = opts.DevRoot
	}
	ledger, err := state.OpenLedger[ledgerEntry](filepath.Join(opts.StateDir, DriverName+".ledger.json"))
	if err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	daemons, err := mps.Open(mps.Options{
		Dir: filepath.Join(opts.StateDir, "mps"), StateFile: filepath.Join(opts.StateDir, DriverName+".mps.json"),
		Programs: opts.Programs, Cgroup: opts.MPSCgroup, ShmSize: opts.MPSShmSize, MemoryLimit: opts.MPSMemoryLimit,
	})
	if err != nil {
		return nil, fmt.Errorf("gpu: %w", err)
	}
	return &Driver{
		nvml:      opts.NVML,
		node:      opts.NodeName,
		published: opts.Published,
		mdevs:     nvml.NewMdevs(opts.SysfsRoot, opts.Sysfs),
		vfs:       nvml.NewVFVGPUs(opts.SysfsRoot, opts.Sysfs),
		sysfs:     opts.SysfsRoot,
		ledger:    ledger,
		nodes:     nodeResolver{dev: opts.DevRoot, nodeDev: opts.DevNodeRoot, proc: opts.ProcRoot, sys: opts.SysfsRoot},
		files:     opts.DriverFiles,
		programs:  opts.Programs,
		mps:       daemons,
		leave:     opts.Settings == config.SettingsLeave,
		noIOMMU:   opts.AllowUnsafeNoIOMMU,
		owners:    map[string]types.UID{},
		users:     map[string]map[types.UID]bool{},
		mpsUsers:  map[string]map[types.UID]bool{},

		toldMPSMode: map[string]bool{},
	}, nil
}

// catalog maps published device names to hardware, from the inventory
// now. Building it costs milliseconds on an 8-GPU node, so the last one
// is kept while the inventory stays the same (the agent's scan between
// changes). Published must not change a slice it returned.
func (d *Driver) catalog() map[string]resources.GPUDevice {
	inv, f := d.published.Current()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cat.devices == nil || d.cat.features != f || !reflect.DeepEqual(d.cat.gpus, inv.GPUs) || !reflect.DeepEqual(d.cat.passthrough, inv.PassthroughGPUs) {
		d.cat.gpus, d.cat.passthrough, d.cat.features = inv.GPUs, inv.PassthroughGPUs, f
		d.cat.devices = resources.GPUDevices(inv.GPUs, inv.PassthroughGPUs, f)
	}
	return d.cat.devices
}

// uuidOf is a GPU's UUID from the last inventory.
func (d *Driver) uuidOf(gpu string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, g := range d.cat.gpus {
		if g.PCIBusID == gpu {
			return g.UUID
		}
	}
	return gpu // nvidia-smi -i takes a PCI address too
}

// MPS is the driver's MPS daemons, for the health monitor.
func (d *Driver) MPS() *mps.Manager { return d.mps }
