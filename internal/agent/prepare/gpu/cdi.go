// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/backend/vfiopci"
)

// What a container gets for a device (its CDI container edits):
//
//   - Whole GPU: /dev/nvidia<minor>, /dev/nvidiactl, /dev/nvidia-uvm and
//     /dev/nvidia-uvm-tools.
//   - MIG device: the same with its parent's /dev/nvidia<minor>, plus the
//     capability nodes of its GPU and compute instance,
//     /dev/nvidia-caps/nvidia-cap<n>, n being the DeviceFileMinor of
//     <proc>/driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>[/ci<ci>]/access.
//     The driver lets a process use a MIG device only through these; CUDA
//     in the container sees exactly the MIG devices whose nodes it has.
//   - vGPU: its VFIO nodes, /dev/vfio/vfio and /dev/vfio/<IOMMU group of
//     the mdev, or of the VF made a vGPU through the vendor-specific VFIO
//     framework>, for the VM (KubeVirt's virt-launcher) that runs it.
//   - Passthrough GPU (bound to vfio-pci): /dev/vfio/vfio and its IOMMU
//     group's node.
//
// Every node is fully specified (type, major, minor), so runtimes need no
// host node to stat: numbers come from the host node under the dev root
// when it exists, else from what the kernel publishes (/proc/devices for
// nvidia-uvm and nvidia-caps, whose majors are dynamic, and
// /sys/class/vfio/<group>/dev). The capability nodes in particular often
// do not exist on the host (nvidia-modprobe makes them on demand), and
// need not: the runtime creates them in the container.
//
// Environment:
//   - NVIDIA_VISIBLE_DEVICES=void: CUDA images set NVIDIA_VISIBLE_DEVICES=all,
//     and where nvidia-container-runtime is the node's runtime in its legacy
//     mode it would then inject every GPU on the node besides ours. "void"
//     makes it inject nothing (NVIDIA's DRA driver does the same), and
//     CDI's value replaces the image's.
//   - HWDRA_<DEVICE>_UUID (GPU or MIG device UUID), HWDRA_<DEVICE>_MDEV
//     (vGPU mdev UUID) and HWDRA_<DEVICE>_PCI (the PCI address a VM
//     launcher opens: the VF of a VFIO framework vGPU, a passthrough
//     GPU's), <DEVICE> the device name in upper case with "_"
//     for "-": one variable per device, so that a container given several
//     devices gets all of them. CUDA_VISIBLE_DEVICES is deliberately not
//     set: per-device CDI edits would overwrite each other's value and a
//     container with two devices would see one. The device metadata file
//     carries the same UUIDs.

// NVIDIA's fixed character major: /dev/nvidia<minor> and /dev/nvidiactl
// (minor 255). /dev/vfio/vfio is the misc device 10:196.
const (
	nvidiaMajor    = 195
	nvidiactlMinor = 255
	miscMajor      = 10
	vfioMiscMinor  = 196
)

// nodeResolver builds CDI device nodes from the host's roots; nodeDev is
// dev as the node names it (the nodes' host paths).
type nodeResolver struct{ dev, nodeDev, proc, sys string }

type numbers func() (major, minor int64, err error)

func fixed(major, minor int64) numbers {
	return func() (int64, int64, error) { return major, minor, nil }
}

// charDev is the node /dev/<name> in the container, <dev root>/<name> on
// the host.
func (r nodeResolver) charDev(name string, fallback numbers) (*cdispec.DeviceNode, error) {
	host := filepath.Join(r.dev, name)
	n := &cdispec.DeviceNode{Path: "/dev/" + name, HostPath: filepath.Join(r.nodeDev, name), Type: "c"}
	var st unix.Stat_t
	if err := unix.Stat(host, &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR {
		n.Major, n.Minor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		return n, nil
	}
	var err error
	if n.Major, n.Minor, err = fallback(); err != nil {
		return nil, fmt.Errorf("device node %s: %w", host, err)
	}
	return n, nil
}

// procMajor is a character driver's major from <proc>/devices.
func (r nodeResolver) procMajor(driver string) (int64, error) {
	return nvml.CharDriverMajor(r.proc, driver)
}

func (r nodeResolver) dynamic(driver string, minor int64, hint string) numbers {
	return func() (int64, int64, error) {
		major, err := r.procMajor(driver)
		if err != nil {
			err = fmt.Errorf("%w (%s)", err, hint)
		}
		return major, minor, err
	}
}

// gpuEdits are the nodes and environment of a whole GPU (the parent's part
// of a MIG device's), and the GPU's minor.
func (d *Driver) gpuEdits(busID string) (*cdispec.ContainerEdits, int, error) {
	// The minor is read now, not taken from the inventory: a MIG mode
	// switch may have re-bound the GPU.
	minor, err := d.nvml.Minor(busID)
	if err != nil {
		return nil, 0, err
	}
	r := d.nodes
	const uvmHint = "is the nvidia-uvm module loaded? nvidia-modprobe -u -c=0 loads it"
	var nodes []*cdispec.DeviceNode
	for _, n := range []struct {
		name string
		num  numbers
	}{
		{fmt.Sprintf("nvidia%d", minor), fixed(nvidiaMajor, int64(minor))},
		{"nvidiactl", fixed(nvidiaMajor, nvidiactlMinor)},
		{"nvidia-uvm", r.dynamic("nvidia-uvm", 0, uvmHint)},
		{"nvidia-uvm-tools", r.dynamic("nvidia-uvm", 1, uvmHint)},
	} {
		node, err := r.charDev(n.name, n.num)
		if err != nil {
			return nil, 0, fmt.Errorf("GPU %s: %w", busID, err)
		}
		nodes = append(nodes, node)
	}
	return &cdispec.ContainerEdits{DeviceNodes: nodes, Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}}, minor, nil
}

// migCaps are the capability nodes of a GPU instance and its compute
// instance on the GPU with that minor.
func (r nodeResolver) migCaps(gpuMinor, gi, ci int) ([]*cdispec.DeviceNode, error) {
	dir := filepath.Join(r.proc, "driver/nvidia/capabilities", fmt.Sprintf("gpu%d/mig/gi%d", gpuMinor, gi))
	var out []*cdispec.DeviceNode
	for _, access := range []string{filepath.Join(dir, "access"), filepath.Join(dir, fmt.Sprintf("ci%d", ci), "access")} {
		minor, mode, err := readCapability(access)
		if err != nil {
			return nil, err
		}
		node, err := r.charDev(fmt.Sprintf("nvidia-caps/nvidia-cap%d", minor),
			r.dynamic("nvidia-caps", minor, "is the NVIDIA driver loaded?"))
		if err != nil {
			return nil, err
		}
		if mode != nil {
			node.FileMode = mode
		}
		out = append(out, node)
	}
	return out, nil
}

// readCapability parses a driver capability file: "DeviceFileMinor: 139",
// "DeviceFileMode: 292" (decimal), ...
func readCapability(path string) (int64, *os.FileMode, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, nil, fmt.Errorf("MIG capability: %w", err)
	}
	minor := int64(-1)
	var mode *os.FileMode
	for _, line := range strings.Split(string(raw), "\n") {
		key, value, _ := strings.Cut(line, ":")
		n, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		if err != nil {
			continue
		}
		switch strings.TrimSpace(key) {
		case "DeviceFileMinor":
			minor = n
		case "DeviceFileMode":
			m := os.FileMode(n)
			mode = &m
		}
	}
	if minor < 0 {
		return 0, nil, fmt.Errorf("MIG capability %s: no DeviceFileMinor", path)
	}
	return minor, mode, nil
}

// vfioEdits are the VFIO nodes of an IOMMU group (a vGPU's, a passthrough
// GPU's; what names the device in a refusal) and the VFIO container. A
// group without an IOMMU behind it is refused unless the configuration
// allows such groups.
func (d *Driver) vfioEdits(what string, group int) (*cdispec.ContainerEdits, error) {
	r := d.nodes
	g, err := vfiopci.VFIOGroup(r.sys, group)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := vfiopci.RefuseNoIOMMU(what, g, d.noIOMMU); err != nil {
		return nil, err
	}
	container, err := r.charDev("vfio/vfio", fixed(miscMajor, vfioMiscMinor))
	if err != nil {
		return nil, err
	}
	// The VFIO group device's numbers, as udev reads them.
	groupNode, err := r.charDev("vfio/"+g.Node, fixed(g.Major, g.Minor))
	if err != nil {
		return nil, err
	}
	return &cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{container, groupNode}, Env: []string{"NVIDIA_VISIBLE_DEVICES=void"}}, nil
}

// envName is HWDRA_<DEVICE>_<what>, the device name in upper case.
func envName(device, what string) string { return prepare.EnvName(device, what) }

// merge adds the driver's files (libraries, programs, hooks) to a
// device's own edits. The device's environment comes last, so it wins
// over the driver files'; device nodes the device has already are not
// repeated.
func merge(own, libs *cdispec.ContainerEdits) *cdispec.ContainerEdits {
	if libs == nil {
		return own
	}
	out := &cdispec.ContainerEdits{
		Env:            append(append([]string(nil), libs.Env...), own.Env...),
		DeviceNodes:    append([]*cdispec.DeviceNode(nil), own.DeviceNodes...),
		Mounts:         append(append([]*cdispec.Mount(nil), own.Mounts...), libs.Mounts...),
		Hooks:          append(append([]*cdispec.Hook(nil), own.Hooks...), libs.Hooks...),
		AdditionalGIDs: append(append([]uint32(nil), own.AdditionalGIDs...), libs.AdditionalGIDs...),
	}
	have := map[string]bool{}
	for _, n := range own.DeviceNodes {
		have[n.Path] = true
	}
	for _, n := range libs.DeviceNodes {
		if !have[n.Path] {
			out.DeviceNodes = append(out.DeviceNodes, n)
		}
	}
	return out
}
