// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/hwdra/hwdra/internal/hw"
)

// GPUs reads every GPU, sorted by PCI bus ID. One GPU's failure never
// hides another: a GPU that fails a required query is left out and named
// in the returned error, a *GPUError (joined with the others') naming the
// GPU (index and bus ID) and the call, wrapping NVML's Return
// (errors.Is(err, nvml.ERROR_GPU_IS_LOST) works); Unreadable lists them.
// Only a failure of the node-wide queries fails the whole call. Optional
// queries that are not supported leave their field at its zero or unknown
// value.
func (b *Backend) GPUs(ctx context.Context) ([]hw.GPU, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if err := b.ready(); err != nil {
		return nil, err
	}
	driver, ret := b.lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("SystemGetDriverVersion: %w", ret)
	}
	cuda, ret := b.lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("SystemGetCudaDriverVersion: %w", ret)
	}
	count, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("DeviceGetCount: %w", ret)
	}
	out := make([]hw.GPU, 0, count)
	var errs []error
	for i := 0; i < count; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		dev, ret := b.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			errs = append(errs, &GPUError{Index: i, Err: fmt.Errorf("GPU %d: DeviceGetHandleByIndex: %w", i, ret)})
			continue
		}
		g, err := b.gpu(gpuRef{index: i}, dev)
		if err != nil {
			errs = append(errs, &GPUError{Index: i, BusID: g.PCIBusID, Err: err})
			continue
		}
		g.DriverVersion = driver
		// SystemGetCudaDriverVersion: 12040 is CUDA 12.4.
		g.CUDADriverVersion = fmt.Sprintf("%d.%d", cuda/1000, cuda%1000/10)
		if j := slices.IndexFunc(out, func(o hw.GPU) bool { return o.PCIBusID == g.PCIBusID }); j >= 0 {
			errs = append(errs, &GPUError{Index: i, BusID: g.PCIBusID,
				Err: fmt.Errorf("GPU %d and GPU %d both report PCI bus ID %s", out[j].Index, g.Index, g.PCIBusID)})
			continue
		}
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b hw.GPU) int { return strings.Compare(a.PCIBusID, b.PCIBusID) })
	return out, errors.Join(errs...)
}

// GPUError is a GPU that GPUs could not read.
type GPUError struct {
	Index int
	// BusID is empty when the GPU did not even tell its PCI address.
	BusID string
	Err   error
}

func (e *GPUError) Error() string { return e.Err.Error() }
func (e *GPUError) Unwrap() error { return e.Err }

// Unreadable lists the GPUs an error of GPUs names, in index order.
func Unreadable(err error) []hw.UnreadableGPU {
	var out []hw.UnreadableGPU
	var walk func(error)
	walk = func(err error) {
		if ge, ok := err.(*GPUError); ok {
			out = append(out, hw.UnreadableGPU{Index: ge.Index, PCIBusID: ge.BusID,
				Lost: errors.Is(ge.Err, nvml.ERROR_GPU_IS_LOST), Error: ge.Err.Error()})
			return
		}
		switch e := err.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	if err != nil {
		walk(err)
	}
	slices.SortFunc(out, func(a, b hw.UnreadableGPU) int { return a.Index - b.Index })
	return out
}

// gpuRef names a GPU in errors.
type gpuRef struct {
	index int
	busID string
}

func (r gpuRef) err(call string, ret nvml.Return) error {
	if r.busID == "" {
		return fmt.Errorf("GPU %d: %s: %w", r.index, call, ret)
	}
	return fmt.Errorf("GPU %d (%s): %s: %w", r.index, r.busID, call, ret)
}

// optional turns "not supported here" into ok=false, other failures into
// an error.
func (r gpuRef) optional(call string, ret nvml.Return) (ok bool, err error) {
	switch ret {
	case nvml.SUCCESS:
		return true, nil
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		return false, nil
	}
	return false, r.err(call, ret)
}

// gpu reads one GPU. On failure the returned GPU has only its PCIBusID,
// if that much was read.
func (b *Backend) gpu(ref gpuRef, dev nvml.Device) (g hw.GPU, err error) {
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return hw.GPU{}, ref.err("GetPciInfo", ret)
	}
	busID, err := busIDFromPCI(pci)
	if err != nil {
		return hw.GPU{}, fmt.Errorf("GPU %d: GetPciInfo: %w", ref.index, err)
	}
	ref.busID = busID
	defer func() {
		if err != nil {
			g = hw.GPU{PCIBusID: busID}
		}
	}()
	g = hw.GPU{PCIBusID: busID, PCIDeviceID: pci.PciDeviceId, PCIeRoot: b.pcieRoot(busID)}
	var arch nvml.DeviceArchitecture
	var major, minor int
	var mem nvml.Memory
	for _, q := range []struct {
		call string
		do   func() nvml.Return
	}{
		{"GetUUID", func() (r nvml.Return) { g.UUID, r = dev.GetUUID(); return }},
		{"GetName", func() (r nvml.Return) { g.ProductName, r = dev.GetName(); return }},
		{"GetIndex", func() (r nvml.Return) { g.Index, r = dev.GetIndex(); return }},
		{"GetMinorNumber", func() (r nvml.Return) { g.Minor, r = dev.GetMinorNumber(); return }},
		{"GetMemoryInfo", func() (r nvml.Return) { mem, r = dev.GetMemoryInfo(); return }},
		{"GetArchitecture", func() (r nvml.Return) { arch, r = dev.GetArchitecture(); return }},
		{"GetCudaComputeCapability", func() (r nvml.Return) { major, minor, r = dev.GetCudaComputeCapability(); return }},
	} {
		if ret := q.do(); ret != nvml.SUCCESS {
			return hw.GPU{}, ref.err(q.call, ret)
		}
	}
	g.MemoryBytes = mem.Total
	g.Architecture = archName(arch)
	g.CUDAComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	if g.NUMANode, err = b.numaNode(ref, dev); err != nil {
		return hw.GPU{}, err
	}
	var byDriverID map[uint32]int
	if g.MIG, byDriverID, err = b.mig(ref, dev, arch, mem.Total); err != nil {
		return hw.GPU{}, err
	}
	mode, ret := dev.GetVirtualizationMode()
	if ok, err := ref.optional("GetVirtualizationMode", ret); err != nil {
		return hw.GPU{}, err
	} else if !ok {
		mode = nvml.GPU_VIRTUALIZATION_MODE_NONE
	}
	g.Virtualization = virtualization(mode)
	if g.Virtualization == hw.VirtualizationHostVGPU {
		if g.VGPU, err = b.vgpu(ref, dev, byDriverID); err != nil {
			return hw.GPU{}, err
		}
		if err := b.vgpuFramework(&g); err != nil {
			return hw.GPU{}, fmt.Errorf("%s: vGPU framework: %w", ref, err)
		}
	}
	return g, nil
}

// busIDFromPCI returns the canonical bus ID. NVML's BusId has an 8-digit
// domain ("00000000:3B:00.0"); the kernel, sysfs and Kubernetes use 4
// digits, lower case ("0000:3b:00.0").
func busIDFromPCI(p nvml.PciInfo) (string, error) {
	s := cString(p.BusId[:])
	if s == "" {
		s = cString(p.BusIdLegacy[:])
	}
	if s == "" {
		return "", fmt.Errorf("empty PCI bus ID")
	}
	return canonicalBusID(s)
}

func canonicalBusID(s string) (string, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return "", fmt.Errorf("PCI bus ID %q is not domain:bus:device.function", s)
	}
	devFn := strings.Split(parts[2], ".")
	if len(devFn) != 2 {
		return "", fmt.Errorf("PCI bus ID %q is not domain:bus:device.function", s)
	}
	var n [4]uint64
	for i, f := range []struct {
		s    string
		bits int
	}{{parts[0], 16}, {parts[1], 8}, {devFn[0], 5}, {devFn[1], 3}} {
		v, err := strconv.ParseUint(f.s, 16, f.bits)
		if err != nil {
			return "", fmt.Errorf("PCI bus ID %q: %w", s, err)
		}
		n[i] = v
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", n[0], n[1], n[2], n[3]), nil
}

func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

// numaNode is NVML's NUMA node, or the kernel's (sysfs numa_node) where
// NVML has no answer: nvmlDeviceGetNumaNodeId is missing from older
// drivers and answers NOT_SUPPORTED on some platforms.
func (b *Backend) numaNode(ref gpuRef, dev nvml.Device) (int, error) {
	if b.has("nvmlDeviceGetNumaNodeId") {
		n, ret := dev.GetNumaNodeId()
		if ok, err := ref.optional("GetNumaNodeId", ret); err != nil || ok {
			return n, err
		}
	}
	data, err := os.ReadFile(filepath.Join(b.sysfs, "bus", "pci", "devices", ref.busID, "numa_node"))
	if err != nil {
		return hw.UnknownNUMANode, nil //nolint:nilerr // no numa_node file: a machine without NUMA
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || n < 0 {
		return hw.UnknownNUMANode, nil //nolint:nilerr // -1 or unreadable: the kernel knows no node
	}
	return n, nil
}

// pcieRoot is the GPU's PCIe root complex from sysfs, "" when unknown.
func (b *Backend) pcieRoot(busID string) string {
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(busID, deviceattribute.WithFSFromRoot(b.sysfs))
	if err != nil || attr.Value.StringValue == nil {
		return ""
	}
	return *attr.Value.StringValue
}

func archName(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "volta"
	case nvml.DEVICE_ARCH_TURING:
		return "turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "ada"
	case nvml.DEVICE_ARCH_HOPPER:
		return "hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "blackwell"
	case nvml.DEVICE_ARCH_RUBIN:
		return "rubin"
	}
	return "unknown"
}

func virtualization(m nvml.GpuVirtualizationMode) hw.Virtualization {
	switch m {
	case nvml.GPU_VIRTUALIZATION_MODE_NONE:
		return hw.VirtualizationNone
	case nvml.GPU_VIRTUALIZATION_MODE_PASSTHROUGH:
		return hw.VirtualizationPassthrough
	case nvml.GPU_VIRTUALIZATION_MODE_VGPU:
		return hw.VirtualizationGuestVGPU
	case nvml.GPU_VIRTUALIZATION_MODE_HOST_VGPU:
		return hw.VirtualizationHostVGPU
	case nvml.GPU_VIRTUALIZATION_MODE_HOST_VSGA:
		return hw.VirtualizationHostVSGA
	}
	return hw.Virtualization(fmt.Sprintf("unknown-%d", m))
}
