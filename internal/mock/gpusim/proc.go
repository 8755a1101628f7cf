// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/hwdra/hwdra/internal/mock/nodefs"
)

// The NVIDIA driver's character device majors, as the mock node's
// /proc/devices lists them. 195 is NVIDIA's fixed major (/dev/nvidia<minor>,
// /dev/nvidiactl at minor 255); the others are allocated dynamically by
// the kernel on a real node, so any value is plausible: these are in the
// range it hands out.
const (
	NVIDIAMajor     = 195
	NVIDIAUVMMajor  = 510
	NVIDIACapsMajor = 511
	nvidiactlMinor  = 255
)

// nodeTree writes the driver's procfs entries (under proc: devices, and
// the capability files driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>[/ci<ci>]/access,
// which appear and vanish as the mock's NVML creates and destroys MIG
// instances) and its device nodes (nvidiactl, nvidia-uvm,
// nvidia-uvm-tools, nvidia<minor>, nvidia-caps/nvidia-cap<n>, vfio/...).
type nodeTree struct {
	proc string
	dev  *nodefs.Dev
}

// capsDir is where the driver publishes MIG capabilities.
func (t *nodeTree) capsDir() string { return filepath.Join(t.proc, "driver/nvidia/capabilities") }

// setup writes /proc/devices, the MIG minors table and the device nodes
// every NVIDIA node has.
func (t *nodeTree) setup(gpuMinors []int, vfio bool) error {
	devices := fmt.Sprintf("Character devices:\n  1 mem\n  4 /dev/vc/0\n  5 /dev/tty\n %3d misc\n%3d nvidia-frontend\n%3d vfio\n%3d nvidia-uvm\n%3d nvidia-caps\n\nBlock devices:\n  8 sd\n259 blkext\n",
		nodefs.MiscMajor, NVIDIAMajor, nodefs.VFIOMajor, NVIDIAUVMMajor, NVIDIACapsMajor)
	if err := writeFile(filepath.Join(t.proc, "devices"), devices); err != nil {
		return err
	}
	// /proc/driver/nvidia-caps/mig-minors lists every capability the driver
	// can hand out, existing or not (NVIDIA's MIG user guide, "Device
	// Nodes"): config 1, monitor 2, then per GPU 15 GPU instance slots of
	// one GI entry and 8 CI entries each (see capMinor).
	var b strings.Builder
	b.WriteString("config 1\nmonitor 2\n")
	for _, g := range gpuMinors {
		for gi := 0; gi < maxGIs; gi++ {
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", g, gi, capMinor(g, gi, -1))
			for ci := 0; ci < maxCIs; ci++ {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", g, gi, ci, capMinor(g, gi, ci))
			}
		}
	}
	if err := writeFile(filepath.Join(t.proc, "driver/nvidia-caps/mig-minors"), b.String()); err != nil {
		return err
	}
	for _, c := range []struct {
		name string
		min  uint32
	}{{"mig/config", 1}, {"mig/monitor", 2}} {
		if err := writeFile(filepath.Join(t.capsDir(), c.name), capsFile(c.min)); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(t.dev.Root, 0o755); err != nil {
		return err
	}
	nodes := []devNode{
		{"nvidiactl", NVIDIAMajor, nvidiactlMinor},
		{"nvidia-uvm", NVIDIAUVMMajor, 0},
		{"nvidia-uvm-tools", NVIDIAUVMMajor, 1},
	}
	for _, m := range gpuMinors {
		nodes = append(nodes, devNode{fmt.Sprintf("nvidia%d", m), NVIDIAMajor, uint32(m)})
	}
	if vfio {
		nodes = append(nodes, devNode{"vfio/vfio", nodefs.MiscMajor, nodefs.VFIOMiscMinor})
	}
	for _, n := range nodes {
		if err := t.dev.Node(n.name, n.major, n.minor); err != nil {
			return err
		}
	}
	return nil
}

type devNode struct {
	name         string
	major, minor uint32
}

// GPU instance IDs run 0..14 and compute instance IDs 0..7 per GPU
// instance: the slots the driver's MIG minors table has room for.
const (
	maxGIs = 15
	maxCIs = 8
)

// capMinor is the nvidia-caps minor of a GPU instance (ci < 0) or compute
// instance, as the driver's mig-minors table numbers them: gpu0/gi0/access
// is 3, gpu0/gi0/ci0/access 4, ..., gpu3/gi3/ci3/access 439.
func capMinor(gpuMinor, gi, ci int) uint32 {
	n := 3 + gpuMinor*maxGIs*(1+maxCIs) + gi*(1+maxCIs)
	if ci >= 0 {
		n += 1 + ci
	}
	return uint32(n)
}

// capsFile is an access file's content as the driver writes it: the minor
// of /dev/nvidia-caps/nvidia-cap<minor>, its mode (0444) and whether
// nvidia-modprobe may change it.
func capsFile(minor uint32) string {
	return fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor)
}

func (t *nodeTree) instanceDir(gpuMinor, gi int) string {
	return filepath.Join(t.capsDir(), fmt.Sprintf("gpu%d/mig/gi%d", gpuMinor, gi))
}

// addInstance publishes a GPU instance (ci < 0) or compute instance: its
// access file and, as nvidia-modprobe would create it, its device node.
func (t *nodeTree) addInstance(gpuMinor, gi, ci int) error {
	if t == nil {
		return nil
	}
	path := filepath.Join(t.instanceDir(gpuMinor, gi), "access")
	if ci >= 0 {
		path = filepath.Join(t.instanceDir(gpuMinor, gi), fmt.Sprintf("ci%d", ci), "access")
	}
	minor := capMinor(gpuMinor, gi, ci)
	if err := writeFile(path, capsFile(minor)); err != nil {
		return err
	}
	return t.dev.Node(fmt.Sprintf("nvidia-caps/nvidia-cap%d", minor), NVIDIACapsMajor, minor)
}

// removeInstance withdraws a GPU or compute instance's capability. The
// device node stays, as on a host: minors are fixed per slot.
func (t *nodeTree) removeInstance(gpuMinor, gi, ci int) {
	if t == nil {
		return
	}
	dir := t.instanceDir(gpuMinor, gi)
	if ci >= 0 {
		dir = filepath.Join(dir, fmt.Sprintf("ci%d", ci))
	}
	os.RemoveAll(dir)
}

// removeGPU withdraws all MIG capabilities of a GPU (after a reset).
func (t *nodeTree) removeGPU(gpuMinor int) {
	if t == nil {
		return
	}
	os.RemoveAll(filepath.Join(t.capsDir(), fmt.Sprintf("gpu%d", gpuMinor)))
}

func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content), 0o644)
}
