// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package profile is the mock hardware's YAML schema: which GPUs and NICs
// a mock node has and in which state, the built-in profiles
// (profiles/*.yaml) and the strict decoding and validation that name the
// field at fault.
package profile

import (
	"embed"
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/hwdra/hwdra/api"
)

// Profile describes a mock node: which GPUs and NICs it has and in which
// state. Built-in profiles live in profiles/*.yaml; any other YAML file of
// the same schema works with --hardware mock:<file>.
type Profile struct {
	// Name defaults to the built-in name or the file name.
	Name string     `json:"name,omitempty"`
	GPUs []GPUGroup `json:"gpus,omitempty"`
	NICs []NICGroup `json:"nics,omitempty"`
	// RDMANetns is the kernel's RDMA network-namespace mode (`rdma
	// system`): "shared" (default) or "exclusive", where an RDMA device
	// belongs to one namespace and moves with its netdev.
	RDMANetns string `json:"rdmaNetns,omitempty"`
	// NoIOMMU: the kernel runs VFIO without an IOMMU (the vfio module's
	// enable_unsafe_noiommu_mode): the VFIO groups of PCI functions bound
	// to a VFIO driver are /dev/vfio/noiommu-<group>, their IOMMU groups
	// named vfio-noiommu. Mediated devices keep their own groups.
	NoIOMMU bool `json:"noIOMMU,omitempty"`
	// Driver is how the NVIDIA driver is installed on the node (a node
	// with GPUs only).
	Driver *Driver `json:"driver,omitempty"`
}

// Driver is how the NVIDIA user-space driver is installed: where, and
// whether whole.
type Driver struct {
	// Root is where the driver is installed on the node, one of
	// DriverRoots: "/" (default), "/run/nvidia/driver" (the GPU
	// operator's driver container), "/usr/local/nvidia" (NVIDIA's CUDA
	// images) or "/home/kubernetes/bin/nvidia" (GKE). The layout under it
	// is the one real nodes have there.
	Root string `json:"root,omitempty"`
	// NoPrograms leaves the driver's programs out (nvidia-smi, the MPS
	// control daemon): an installation with NVML and libraries only.
	NoPrograms bool `json:"noPrograms,omitempty"`
}

// DriverRoots are the driver roots real nodes use, each with its layout:
// programs in usr/bin and libraries in usr/lib/<triplet> (FHS: the host,
// the GPU operator's driver container), or programs in bin and libraries
// in lib64 (flat: CUDA images, GKE).
var DriverRoots = map[string]DriverLayout{
	"/":                           {Bin: "usr/bin", Lib: "usr/lib/x86_64-linux-gnu"},
	"/run/nvidia/driver":          {Bin: "usr/bin", Lib: "usr/lib/x86_64-linux-gnu"},
	"/usr/local/nvidia":           {Bin: "bin", Lib: "lib64"},
	"/home/kubernetes/bin/nvidia": {Bin: "bin", Lib: "lib64"},
}

// DriverLayout is where a driver root keeps its programs and libraries.
type DriverLayout struct{ Bin, Lib string }

// DriverRoot is where the profile's driver is installed ("/" by default).
func (p Profile) DriverRoot() string {
	if p.Driver == nil || p.Driver.Root == "" {
		return "/"
	}
	return p.Driver.Root
}

// GPU virtualization modes and vGPU frameworks of a profile.
const (
	VirtualizationNone        = "none"
	VirtualizationHostVGPU    = "host-vgpu"
	VirtualizationPassthrough = "passthrough"
	VGPUFrameworkMdev         = "mdev"
	VGPUFrameworkVFIO         = "vfio"
)

// MaxDefaultGPUAddresses is how many GPUs of a profile may go without
// pciBusIDs: the mock gives them the DGX H100's eight addresses, then
// buses e8 to ff, one GPU each.
const MaxDefaultGPUAddresses = 32

// RDMA network-namespace modes.
const (
	RDMANetnsShared    = "shared"
	RDMANetnsExclusive = "exclusive"
)

// GPUGroup is Count identical GPUs.
type GPUGroup struct {
	// Model is one of model.GPUNames(): "a100-40gb", "h100-80gb", ...
	Model string `json:"model"`
	Count int    `json:"count"`
	// PCIBusIDs, when set, has Count entries; otherwise addresses are
	// assigned in order.
	PCIBusIDs []string `json:"pciBusIDs,omitempty"`
	// NUMANodes, when set, has Count entries; otherwise the first half of
	// the GPUs is on NUMA node 0 and the rest on node 1, as on a DGX.
	NUMANodes []int `json:"numaNodes,omitempty"`
	// MIG turns MIG mode on at start.
	MIG bool `json:"mig,omitempty"`
	// MIGInstances are GPU instances (each with one full-size compute
	// instance) that exist at start on every GPU of the group. Needs MIG.
	MIGInstances []MIGInstance `json:"migInstances,omitempty"`
	// Virtualization is "none" (default), "host-vgpu" (the vGPU manager
	// runs the GPUs) or "passthrough" (the GPUs are bound to vfio-pci:
	// NVML does not see them, a VM takes each whole through its VFIO
	// group).
	Virtualization string `json:"virtualization,omitempty"`
	// VGPUFramework is how a host-vgpu GPU's vGPUs are created: "mdev"
	// (default: mediated devices on its VFs) or "vfio" (NVIDIA's
	// vendor-specific VFIO framework of R550+ drivers on Ada, Hopper and
	// Blackwell: a type ID written to a VF's nvidia/current_vgpu_type).
	VGPUFramework string `json:"vgpuFramework,omitempty"`
	// VGPUTypes overrides the model's vGPU types in host-vgpu mode.
	VGPUTypes []VGPUType `json:"vgpuTypes,omitempty"`
	// VGPUHeterogeneous lets time-sliced vGPU types of different sizes mix.
	VGPUHeterogeneous bool `json:"vgpuHeterogeneous,omitempty"`
	// NoRecoveryAction: the driver does not report NVML's GPU recovery
	// action field (drivers before it existed), so XIDs are judged by
	// their number alone.
	NoRecoveryAction bool `json:"noRecoveryAction,omitempty"`
	// Timings slow the group's GPUs down: how long each kind of call
	// takes, e.g. {createGpuInstance: 3s}, so that a test can catch a
	// caller in the middle of one (see GPUTimings). Not part of the
	// hardware: a persistent mock (HWDRA_MOCK_DIR) may be reopened with
	// other timings.
	Timings *GPUTimings `json:"timings,omitempty"`
}

// MIGInstance is a pre-existing GPU instance.
type MIGInstance struct {
	// Profile is a profile name as the model reports it ("3g.40gb").
	Profile string `json:"profile"`
	// Start is the first memory slice of the placement.
	Start int `json:"start"`
}

// VGPUType is a vGPU type in a profile file.
type VGPUType struct {
	Name          string `json:"name"`
	Class         string `json:"class,omitempty"`
	FramebufferMB uint64 `json:"framebufferMB"`
	MaxInstances  int    `json:"maxInstances"`
	// MIGProfile makes the type MIG-backed: each vGPU occupies a GPU
	// instance of this profile ("1g.10gb").
	MIGProfile string `json:"migProfile,omitempty"`
}

//go:embed profiles/*.yaml
var builtin embed.FS

// Builtins lists the built-in profile names.
func Builtins() []string {
	entries, _ := builtin.ReadDir("profiles")
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	sort.Strings(names)
	return names
}

// Load reads a built-in profile by name, or a YAML profile file by path
// (anything containing a path separator or ending in .yaml/.yml).
func Load(nameOrPath string) (Profile, error) {
	var (
		data []byte
		err  error
		name = nameOrPath
	)
	if strings.ContainsRune(nameOrPath, os.PathSeparator) || strings.HasSuffix(nameOrPath, ".yaml") || strings.HasSuffix(nameOrPath, ".yml") {
		data, err = os.ReadFile(nameOrPath)
		if err != nil {
			return Profile{}, fmt.Errorf("mock profile: %w", err)
		}
		name = strings.TrimSuffix(strings.TrimSuffix(path.Base(nameOrPath), ".yaml"), ".yml")
	} else {
		data, err = builtin.ReadFile("profiles/" + nameOrPath + ".yaml")
		if err != nil {
			return Profile{}, fmt.Errorf("unknown mock profile %q (built-in profiles: %s; or give a YAML file path)",
				nameOrPath, strings.Join(Builtins(), ", "))
		}
	}
	return Parse(name, data)
}

// ParseOrLoad reads a profile given as its YAML (anything with a colon,
// named name) or, like Load, as a built-in name or a file.
func ParseOrLoad(name, spec string) (Profile, error) {
	if strings.Contains(spec, ":") {
		return Parse(name, []byte(spec))
	}
	return Load(spec)
}

// Parse decodes and validates a profile strictly, as every hwdra file is
// decoded (api.Unmarshal): unknown fields and wrong types are errors that
// name the field.
func Parse(name string, data []byte) (Profile, error) {
	var p Profile
	if err := api.Unmarshal(data, &p); err != nil {
		return Profile{}, fmt.Errorf("mock profile %q: %w", name, err)
	}
	if p.Name == "" {
		p.Name = name
	}
	if err := p.validate(); err != nil {
		return Profile{}, fmt.Errorf("mock profile %q: %w", name, err)
	}
	return p, nil
}

func (p Profile) validate() error {
	// Every problem at once: each check below, each group's first.
	var errs []error
	if len(p.GPUs) == 0 && len(p.NICs) == 0 {
		errs = append(errs, fmt.Errorf("no gpus and no nics: a profile needs at least one"))
	}
	switch p.RDMANetns {
	case "", RDMANetnsShared, RDMANetnsExclusive:
	default:
		errs = append(errs, fmt.Errorf("rdmaNetns: %q is not %s or %s", p.RDMANetns, RDMANetnsShared, RDMANetnsExclusive))
	}
	if p.Driver != nil {
		if _, ok := DriverRoots[p.DriverRoot()]; !ok {
			roots := make([]string, 0, len(DriverRoots))
			for r := range DriverRoots {
				roots = append(roots, r)
			}
			sort.Strings(roots)
			errs = append(errs, fmt.Errorf("driver.root: %q is none of the roots real nodes use (%s)", p.Driver.Root, strings.Join(roots, ", ")))
		}
	}
	unaddressed := 0
	for i, g := range p.GPUs {
		if err := g.validate(); err != nil {
			errs = append(errs, prefixEach(fmt.Sprintf("gpus[%d].", i), err)...)
		}
		if g.PCIBusIDs == nil {
			unaddressed += g.Count
		}
	}
	if unaddressed > MaxDefaultGPUAddresses {
		errs = append(errs, fmt.Errorf("gpus: %d GPUs without pciBusIDs, the mock has default PCI addresses for %d (the DGX H100's eight, then buses e8 to ff): give the others pciBusIDs",
			unaddressed, MaxDefaultGPUAddresses))
	}
	for i, n := range p.NICs {
		if err := n.validate(); err != nil {
			errs = append(errs, prefixEach(fmt.Sprintf("nics[%d].", i), err)...)
		}
	}
	return errors.Join(errs...)
}

// prefixEach puts a group's field before each of its errors (several
// where they were joined).
func prefixEach(prefix string, err error) []error {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = fmt.Errorf("%s%w", prefix, e)
	}
	return out
}
