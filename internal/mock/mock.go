// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package mock is a mock node's hardware, built from a profile: GPUs
// behind a go-nvml mock that refuses what the hardware refuses, SR-IOV
// NICs in a fake sysfs tree, state that outlives the process, and faults
// injected from outside. Only hardware is mocked: the project's backends
// run on it unchanged.
//
// The parts live in subpackages, each with one job: profile (the YAML
// schema and built-in profiles), model (the GPU and NIC models), gpusim
// and nicsim (the GPU and NIC sides), nodefs (the sysfs and /dev files
// both sides write), persist (state across processes, timings) and fault
// (`hwdra mock inject`). Tests open a mock with mocktest.
package mock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/drivertools"
	"github.com/hwdra/hwdra/internal/mock/fault"
	"github.com/hwdra/hwdra/internal/mock/gpusim"
	"github.com/hwdra/hwdra/internal/mock/nicsim"
	"github.com/hwdra/hwdra/internal/mock/nodefs"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/internal/mock/profile"
)

// Hardware is a running mock node: an nvml.Interface that behaves like the
// profile's GPUs and a fake sysfs tree holding its PCI devices and NICs.
type Hardware struct {
	Profile profile.Profile
	// NVML is go-nvml's mock server, wrapped so it refuses what the
	// hardware refuses.
	NVML nvml.Interface
	// Sysfs is the root of the fake sysfs tree (what /sys is on a host).
	Sysfs string

	dir    *persist.Dir // saves state and paces calls
	gpus   *gpusim.GPUs
	nics   *nicsim.NICs
	faults *fault.Inbox // injected faults from other processes
}

// The trees of the mock's directory: what /sys, /proc and /dev are on a
// host.
const (
	sysTree  = "sys"
	procTree = "proc"
	devTree  = "dev"
	// hostTree is the node's "/" as far as the mock fills it: the NVIDIA
	// driver's installation, under the profile's driver root.
	hostTree = "host"
)

// Open loads a profile (built-in name or YAML file) and builds it.
func Open(spec string) (*Hardware, error) {
	p, err := profile.Load(spec)
	if err != nil {
		return nil, err
	}
	return New(p)
}

// New builds the mock hardware of a profile in a fresh temp directory, or
// in $HWDRA_MOCK_DIR, restoring the state an earlier process left there
// (see persist.DirEnv).
func New(p profile.Profile) (*Hardware, error) {
	// The host tree (the driver's installation) is kept across processes,
	// as a node's disk is: a test may have put a real library in it.
	dir, err := persist.Open(p, sysTree, procTree, devTree, fault.InboxDir)
	if err != nil {
		return nil, err
	}
	h := &Hardware{Profile: p, Sysfs: filepath.Join(dir.Path(), sysTree), dir: dir}
	if err := h.build(); err != nil {
		return nil, errors.Join(err, h.Close())
	}
	return h, nil
}

// build builds the parts in the mock's directory, applies the state an
// earlier process saved there (if any) and takes faults.
func (h *Hardware) build() error {
	if err := os.MkdirAll(h.Sysfs, 0o755); err != nil {
		return err
	}
	dev := nodefs.NewDev(h.DevRoot())
	dev.NoIOMMU = h.Profile.NoIOMMU
	if err := dev.NoIOMMUMode(h.Sysfs); err != nil {
		return err
	}
	var err error
	if h.gpus, err = gpusim.Build(h.Profile, h.Sysfs, h.ProcRoot(), dev, h.dir); err != nil {
		return fmt.Errorf("mock profile %q: %w", h.Profile.Name, err)
	}
	h.NVML = h.gpus.NVML
	if err := h.installDriver(); err != nil {
		return err
	}
	if h.nics, err = nicsim.Build(h.Profile, h.Sysfs, dev, h.dir.Persistent(), h.dir); err != nil {
		return fmt.Errorf("mock profile %q: %w", h.Profile.Name, err)
	}
	if err := h.dir.Start(append(h.gpus.BusIDs(), h.nics.Netdevs()...), h.gpus, h.nics); err != nil {
		return err
	}
	h.faults, err = fault.Serve(h.dir.Path(), h.Inject)
	return err
}

// Close removes everything the mock created; a persistent mock
// (persist.DirEnv) keeps its directory, state and trees, as hardware
// outlives its users. A second Close does nothing.
func (h *Hardware) Close() error {
	h.faults.Close()
	return errors.Join(h.nics.Close(), h.dir.Close())
}

// Dir is the directory the mock lives in: its trees and, with
// persist.DirEnv, its saved state.
func (h *Hardware) Dir() string { return h.dir.Path() }

// Persistent reports whether the mock keeps its state across processes
// (persist.DirEnv).
func (h *Hardware) Persistent() bool { return h.dir.Persistent() }

// ProcRoot is the mock node's procfs root (what /proc is on a host): it
// holds devices, the loaded kernel module's driver/nvidia/version (gone
// while the driver is unloaded) and the NVIDIA driver's capability files,
// driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>[/ci<ci>]/access, which
// appear and vanish as the mock's NVML creates and destroys MIG instances.
func (h *Hardware) ProcRoot() string { return filepath.Join(h.dir.Path(), procTree) }

// DevRoot is the mock node's /dev. Running as root the mock creates real
// character devices there (nvidiactl, nvidia-uvm, nvidia-uvm-tools,
// nvidia<minor>, nvidia-caps/nvidia-cap<n>, vfio/..., infiniband/...), so
// that a CDI spec pointing at them can be injected and a runtime can
// create them in a container; otherwise the directory stays without
// device nodes (nodefs.CanMknod).
func (h *Hardware) DevRoot() string { return filepath.Join(h.dir.Path(), devTree) }

// HostRoot is the mock node's "/" as far as the mock fills it: the NVIDIA
// driver's installation under the profile's driver root.
func (h *Hardware) HostRoot() string { return filepath.Join(h.dir.Path(), hostTree) }

// DriverRoot is the mock node's NVIDIA driver root as this process sees
// it (HostRoot and the profile's driver.root: what /, /run/nvidia/driver,
// /usr/local/nvidia or /home/kubernetes/bin/nvidia is on a node).
func (h *Hardware) DriverRoot() string { return filepath.Join(h.HostRoot(), h.Profile.DriverRoot()) }

// DriverBin is where the driver's programs are: nvidia-cuda-mps-control
// and nvidia-smi, stand-ins that record what they are told
// (mock/drivertools), in the driver root's usr/bin or bin.
func (h *Hardware) DriverBin() string {
	return filepath.Join(h.DriverRoot(), profile.DriverRoots[h.Profile.DriverRoot()].Bin)
}

// installDriver lays out the NVIDIA driver's installation on a node with
// GPUs for NVML, as real nodes have it under the profile's root: the
// programs the agent runs (stand-ins) and stand-ins of the user-space
// libraries of the mock NVML's driver version, which containers get.
func (h *Hardware) installDriver() error {
	if h.gpus.DriverVersion == "" {
		return nil // no GPU for the NVIDIA driver: not installed
	}
	layout := profile.DriverRoots[h.Profile.DriverRoot()]
	if h.Profile.Driver == nil || !h.Profile.Driver.NoPrograms {
		if err := drivertools.Install(h.DriverBin(), h.Persistent()); err != nil {
			return err
		}
	}
	return drivertools.InstallLibraries(filepath.Join(h.DriverRoot(), layout.Lib), h.gpus.DriverVersion)
}

// DriverVersion is the NVIDIA driver version the mock's NVML reports
// ("550.54.15"); "" without GPUs for NVML.
func (h *Hardware) DriverVersion() string { return h.gpus.DriverVersion }

// TimeSlice is the compute time slice nvidia-smi set on the GPU at a PCI
// address (0: the default).
func (h *Hardware) TimeSlice(busID string) (int, error) { return h.gpus.TimeSlice(busID) }

// ComputeMode is the NVML compute mode of the GPU at a PCI address.
func (h *Hardware) ComputeMode(busID string) (nvml.ComputeMode, error) {
	return h.gpus.ComputeMode(busID)
}

// Calls is how many times each call reached each device (GPU PCI
// address, PF netdev) since the node was first built, by device then
// call (persist.State.Calls; persist.SettingCalls picks a GPU's settings'
// out): what a test counts to tell that nothing was asked of the
// hardware, where a change undone leaves the state as it was.
func (h *Hardware) Calls() map[string]map[string]int { return h.dir.Calls() }

// NICs is the mock's NIC side (empty when the profile has none).
func (h *Hardware) NICs() *nicsim.NICs { return h.nics }

// SysfsWriter writes the mock's sysfs attributes as the kernel answers
// such writes (mediated devices).
func (h *Hardware) SysfsWriter() *gpusim.SysfsWriter { return h.gpus.SysfsWriter() }

// MdevUUIDs lists the mediated devices that exist, sorted.
func (h *Hardware) MdevUUIDs() []string { return h.gpus.MdevUUIDs() }

// VGPUVFs lists the VFs that are vGPUs of the vendor-specific VFIO
// framework, "<VF address>=<type ID>", sorted.
func (h *Hardware) VGPUVFs() []string { return h.gpus.VGPUVFs() }

// ResetGPU resets the GPU at a PCI address, like `nvidia-smi --gpu-reset`
// (gpusim.GPUs.Reset).
func (h *Hardware) ResetGPU(busID string) error { return h.gpus.Reset(busID) }

// SetGPUProcesses makes the GPU at a PCI address list these processes as
// running on it (none: idle), as NVML's compute list (all of them) and
// MPS list (those with MPS) show them; a process that exits drops out of
// both, as on the driver (gpusim.GPUs.SetProcesses).
func (h *Hardware) SetGPUProcesses(busID string, procs []hw.GPUProcess) error {
	return h.gpus.SetProcesses(busID, procs)
}

// SetRunningProcesses is SetGPUProcesses of PIDs alone (outside MPS and
// MIG, memory not told).
func (h *Hardware) SetRunningProcesses(busID string, pids ...uint32) error {
	return h.gpus.SetRunningProcesses(busID, pids...)
}

// SetDriverLoaded loads or unloads the mock's NVIDIA driver. Unloading
// fails while a process has NVML initialised (the module is in use).
func (h *Hardware) SetDriverLoaded(loaded bool) error { return h.gpus.SetDriverLoaded(loaded) }

// DriverLoaded reports whether the mock's NVIDIA driver is loaded.
func (h *Hardware) DriverLoaded() bool { return h.gpus.DriverLoaded() }

// SetLink takes a PF's link (netdev name or PCI address) down or up, as
// pulling and plugging the cable would (nicsim.NICs.SetLink).
func (h *Hardware) SetLink(pf string, up bool) error { return h.nics.SetLink(pf, up) }

// Inject applies a fault to this mock hardware.
func (h *Hardware) Inject(f fault.Fault) error {
	switch f.Kind {
	case fault.XID:
		return h.gpus.XID(f.GPU, f.XID, f.GPUInstance, f.ComputeInstance)
	case fault.Clear:
		return h.gpus.Recover(f.GPU)
	case fault.GPULost:
		return h.gpus.Lose(f.GPU)
	case fault.Stall:
		return h.gpus.Stall(f.GPU)
	case fault.Resume:
		return h.gpus.Resume(f.GPU)
	case fault.Link:
		return h.SetLink(f.PF, f.Up)
	case fault.Driver:
		return h.SetDriverLoaded(f.Up)
	case fault.TimeSlice:
		return h.gpus.SetTimeSlice(f.GPU, f.TimeSlice)
	case fault.Processes:
		return h.SetGPUProcesses(f.GPU, f.Processes)
	case fault.VFRefuse:
		return h.nics.RefuseVFSetting(f.PF, f.Setting)
	}
	return fmt.Errorf("unknown fault %q (known: %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", f.Kind,
		fault.XID, fault.Clear, fault.GPULost, fault.Stall, fault.Resume, fault.Link, fault.Driver, fault.TimeSlice, fault.Processes, fault.VFRefuse)
}
