// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"

	"github.com/hwdra/hwdra/internal/mock/model"
	"github.com/hwdra/hwdra/internal/mock/nodefs"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

// nameUUID is a name-based (SHA-1) UUID in the mock's namespace: go-nvml's
// server draws random ones on every New, we derive them from the profile
// and the PCI address so output is stable across runs.
func nameUUID(name []byte) string {
	return uuid.NewSHA1(uuid.MustParse("6f1c0a4e-6a37-4c55-9d0e-6877647261a1"), name).String()
}

// gpu is one mock GPU: go-nvml's server.Device, whose ...Func fields
// we replace so it answers and refuses like the hardware. It also offers
// GetGpuInstanceProfileInfoV3 (see there).
type gpu struct {
	*server.Device
	model *model.GPU
	// busID is canonical ("0000:1b:00.0").
	busID string
	numa  int
	virt  nvml.GpuVirtualizationMode
	vgpus []nvml.VgpuTypeId
	// heterogeneous: vGPU heterogeneous (mixed-size time-sliced) mode.
	heterogeneous bool
	// vfioFramework: the vGPU manager creates vGPUs through the
	// vendor-specific VFIO framework, not as mediated devices.
	vfioFramework bool

	// Guarded by the server.Device lock, like its GpuInstances map.
	migCurrent, migPending int
	// processes set to run on the GPU, by PID (processes.go: NVML
	// lists those still running).
	processes []persist.ProcessState
	// computeMode and timeSlice are the GPU's sharing settings
	// (sharing.go).
	computeMode nvml.ComputeMode
	timeSlice   int
	// vgpus hosted, by mdev UUID (see mdev.go).
	active []*vgpuInstance

	// onChange refreshes the mdev emulation's view of this GPU after MIG
	// changes (nil: no vGPU host).
	onChange func()

	// tree publishes MIG capabilities and device nodes; nil in unit tests
	// of the device alone.
	tree *nodeTree
	// rep is told of each change (it saves the node's state and paces
	// the calls).
	rep persist.Reporter
	// serials number compute instances in creation order (for MIG UUIDs).
	serials    sync.Map // *server.ComputeInstance -> uint64
	nextSerial atomic.Uint64
	// health is the GPU's fault state (health.go).
	health gpuHealth
}

// newGPU wraps the server's device and installs the hardware
// behaviour.
func newGPU(sd *server.Device, m *model.GPU, profileName, busID string, numa int) *gpu {
	d := &gpu{Device: sd, model: m, busID: busID, numa: numa, virt: nvml.GPU_VIRTUALIZATION_MODE_NONE}
	sd.UUID = "GPU-" + nameUUID([]byte(profileName+"/"+busID))
	sd.PciBusID = nvmlBusID(busID)

	sd.GetPciInfoFunc = d.pciInfo
	sd.GetNumaNodeIdFunc = func() (int, nvml.Return) { return d.numa, nvml.SUCCESS }
	sd.GetVirtualizationModeFunc = func() (nvml.GpuVirtualizationMode, nvml.Return) { return d.virt, nvml.SUCCESS }
	sd.GetMigModeFunc = func() (int, int, nvml.Return) {
		d.RLock()
		defer d.RUnlock()
		return d.migCurrent, d.migPending, nvml.SUCCESS
	}
	sd.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		activation, ret := d.setMigMode(mode)
		d.notify()
		d.changed(persist.CallSetMigMode, ret == nvml.SUCCESS)
		return activation, ret
	}
	sd.GetGpuInstanceProfileInfoVFunc = func(int) nvml.GpuInstanceProfileInfoHandler {
		// go-nvml's handler has unexported fields and its V1/V2/V3 call
		// the C library directly: without libnvidia-ml loaded that kills
		// the process. A clear panic is the kindest answer.
		panic("mock GPU: GetGpuInstanceProfileInfoV's handler can only call the real NVML library; " +
			"use GetGpuInstanceProfileInfoV3 on the mock device instead")
	}
	d.installMIG()
	d.installVGPU()
	d.installSharing()
	d.installProcesses()
	return d
}

// changed reports a call on the GPU: ok after its change, not after a
// refusal (which is counted all the same: the call reached the GPU).
func (d *gpu) changed(call string, ok bool) { d.rep.Changed(call, d.busID, ok) }

// GetGpuInstanceProfileInfoV3 answers what GetGpuInstanceProfileInfoV(p).V3()
// answers on hardware (the v3 info, name included). It exists because
// go-nvml's handler cannot be mocked; the nvml backend looks for this
// method on devices that are not go-nvml's own.
func (d *gpu) GetGpuInstanceProfileInfoV3(profile int) (nvml.GpuInstanceProfileInfo_v3, nvml.Return) {
	if profile < 0 || profile >= nvml.GPU_INSTANCE_PROFILE_COUNT {
		return nvml.GpuInstanceProfileInfo_v3{}, nvml.ERROR_INVALID_ARGUMENT
	}
	for _, p := range d.model.Profiles {
		if p.Index == profile {
			return p.GIInfoV3(), nvml.SUCCESS
		}
	}
	return nvml.GpuInstanceProfileInfo_v3{}, nvml.ERROR_NOT_SUPPORTED
}

// nvmlBusID is NVML's PciInfo.BusId form: 8-digit domain, upper case
// ("00000000:1B:00.0"). busID must be canonical.
func nvmlBusID(busID string) string {
	return strings.ToUpper("0000" + busID)
}

// pciInfo fills what go-nvml's server leaves empty: BusId, BusIdLegacy,
// Domain, Bus, Device.
func (d *gpu) pciInfo() (nvml.PciInfo, nvml.Return) {
	var domain, bus, dev, fn uint32
	if _, err := fmt.Sscanf(d.busID, "%04x:%02x:%02x.%x", &domain, &bus, &dev, &fn); err != nil {
		return nvml.PciInfo{}, nvml.ERROR_UNKNOWN
	}
	info := nvml.PciInfo{
		Domain:      domain,
		Bus:         bus,
		Device:      dev,
		PciDeviceId: d.Config.PciDeviceId,
	}
	copyCString(info.BusId[:], nvmlBusID(d.busID))
	copyCString(info.BusIdLegacy[:], strings.ToUpper(d.busID))
	return info, nvml.SUCCESS
}

func copyCString(dst []int8, s string) {
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = int8(s[i])
	}
}

// setMigMode changes the MIG mode as the hardware does. SetMigMode returns
// (activationStatus, ret).
//   - GPU instances exist, or processes or vGPUs run on the GPU: refused
//     with ERROR_IN_USE (nvidia-smi: "In use by another client"); instances
//     must be destroyed and processes ended first.
//   - Hopper and later switch at once, without a GPU reset.
//   - Ampere: the new mode is only pending (GetMigMode reports current !=
//     pending) until the GPU is reset; activationStatus says
//     ERROR_RESET_REQUIRED. On bare metal the driver resets an idle A100
//     itself; a busy GPU or a pass-through VM stays pending, which is the
//     case an agent must handle. GPUs.Reset applies it.
func (d *gpu) setMigMode(mode int) (nvml.Return, nvml.Return) {
	if mode != nvml.DEVICE_MIG_DISABLE && mode != nvml.DEVICE_MIG_ENABLE {
		return nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_INVALID_ARGUMENT
	}
	d.Lock()
	defer d.Unlock()
	if len(d.GpuInstances) > 0 || len(d.runningLocked()) > 0 || len(d.active) > 0 {
		return nvml.ERROR_IN_USE, nvml.ERROR_IN_USE
	}
	d.migPending = mode
	if d.model.HopperOrLater() {
		d.migCurrent = mode
		d.MigMode = mode
		return nvml.SUCCESS, nvml.SUCCESS
	}
	if d.migCurrent != mode {
		return nvml.ERROR_RESET_REQUIRED, nvml.SUCCESS
	}
	return nvml.SUCCESS, nvml.SUCCESS
}

// reset is a GPU reset: a pending MIG mode takes effect and MIG instances,
// which do not survive a reset, are gone.
func (d *gpu) reset() {
	d.Lock()
	defer d.Unlock()
	clear(d.GpuInstances)
	d.tree.removeGPU(d.Minor)
	d.migCurrent = d.migPending
	d.MigMode = d.migPending
	d.Unlock()
	d.notify()
	d.Lock()
}

//go:generate go test . -run ^TestHandleForwardersCurrent$ -update

// installServer fixes the server-level lookups, which type-assert devices
// to *server.Device and compare bus IDs verbatim, and answers the function
// forms of the handle methods (lib.DeviceGetUUID(dev), ...).
func installServer(s *server.Server) {
	forwardHandleFuncs(s)
	s.DeviceGetHandleByUUIDFunc = func(id string) (nvml.Device, nvml.Return) {
		for _, d := range s.Devices {
			if d.(*gpu).UUID == id {
				return d, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	s.DeviceGetHandleByPciBusIdFunc = func(busID string) (nvml.Device, nvml.Return) {
		want, ok := nodefs.CanonicalAddress(busID)
		if !ok {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		for _, d := range s.Devices {
			if d.(*gpu).busID == want {
				return d, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
}
