// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/mock/drivertools"
	"github.com/hwdra/hwdra/internal/mock/fault"
	"github.com/hwdra/hwdra/internal/mock/mocktest"
	"github.com/hwdra/hwdra/internal/mock/persist"
)

// gpuNIC is a healthy node: two GPUs for the NVIDIA driver and an SR-IOV
// NIC with VFs on its network driver.
const gpuNIC = "gpus: [{model: h100-80gb, count: 2}]\nnics: [{model: cx7, count: 1, vfs: 4, pciAddresses: [\"0000:17:00.0\"]}]\n"

// ids are every check's ID, in the order they run.
var ids = []string{"nvml", "driver-root", "driver-version", "driver-files", "nvidia-cdi-hook", "mig-mode", "compute-mode", "mps-daemons",
	"device-nodes", "passthrough", "vfio-noiommu", "sriov", "nri", "kubelet-dirs", "cdi-dir", "state-dir", "api-server", "dra-api", "dra-features"}

// open opens a mock node of a profile's YAML, written to a file as an
// operator would give it.
func open(t *testing.T, profile string) *backend.Node {
	t.Helper()
	spec := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(spec, []byte(profile), 0o644); err != nil {
		t.Fatal(err)
	}
	n, err := backend.Open(backend.MockPrefix + spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// input is the agent's view of a node whose kubelet, runtime (with NRI)
// and nvidia-cdi-hook are there.
func input(t *testing.T, n *backend.Node) Input {
	t.Helper()
	dir := t.TempDir()
	in := Input{Node: n, NodeName: "worker-1", Paths: Paths{
		RegistrarDir: filepath.Join(dir, "plugins_registry"), PluginsDir: filepath.Join(dir, "plugins"),
		CDIDir: filepath.Join(dir, "cdi"), StateDir: filepath.Join(dir, "state"), NRISocket: filepath.Join(dir, "nri.sock"),
	}, CDIHook: filepath.Join(dir, "nvidia-cdi-hook")}
	for _, d := range []string{in.Paths.RegistrarDir, in.Paths.PluginsDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(in.CDIHook, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", in.Paths.NRISocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return in
}

// check is the report's check of an ID.
func check(t *testing.T, r Report, id string) Check {
	t.Helper()
	for _, c := range r.Checks {
		if c.ID == id {
			return c
		}
	}
	t.Fatalf("no check %q in %+v", id, r)
	return Check{}
}

// want fails unless the check has the status and its summary (and fix,
// for anything not OK) hold every word given.
func want(t *testing.T, r Report, id string, s Status, words ...string) Check {
	t.Helper()
	c := check(t, r, id)
	text := c.Summary + "\n" + strings.Join(c.Details, "\n") + "\nfix: " + c.Fix
	if c.Status != s {
		t.Errorf("%s: %s, want %s:\n%s", id, c.Status, s, text)
	}
	for _, w := range words {
		if !strings.Contains(text, w) {
			t.Errorf("%s: no %q in:\n%s", id, w, text)
		}
	}
	if (s == Warn || s == Blocker) && c.Fix == "" {
		t.Errorf("%s: %s without a fix", id, s)
	}
	return c
}

func text(t *testing.T, r Report) string {
	var b bytes.Buffer
	if err := r.WriteText(&b, true); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestHealthyNode: a node with GPUs and a NIC, its kubelet, runtime and
// hook there, has no blocker and no warning; each check says what it
// found, and every check runs, in order.
func TestHealthyNode(t *testing.T) {
	n := open(t, gpuNIC)
	r := Run(context.Background(), input(t, n))
	t.Log("\n" + text(t, r))
	var got []string
	for _, c := range r.Checks {
		got = append(got, c.ID)
	}
	if !slices.Equal(got, ids) {
		t.Errorf("checks %v, want %v", got, ids)
	}
	if r.Count(Blocker) != 0 || r.Count(Warn) != 0 {
		t.Errorf("%d blockers, %d warnings on a healthy node", r.Count(Blocker), r.Count(Warn))
	}
	want(t, r, "nvml", OK, "2 GPUs, driver 550.54.15, CUDA 12.4", n.Driver().NVML)
	want(t, r, "driver-root", OK, "programs in "+n.Mock().DriverBin())
	want(t, r, "driver-version", OK, "kernel module 550.54.15, libraries of 550.54.15")
	want(t, r, "driver-files", OK, "generated from the driver root", "libcuda among them")
	want(t, r, "nvidia-cdi-hook", OK, "given: ")
	want(t, r, "mig-mode", OK, "MIG enabled on 0, disabled on 2")
	want(t, r, "compute-mode", OK, "gpus.settings Manage; compute mode Default on 2")
	want(t, r, "mps-daemons", OK, "no MPS control daemon runs")
	if n.NoDevNodes {
		want(t, r, "device-nodes", Skip, "not run as root")
	} else {
		want(t, r, "device-nodes", OK, "5 device nodes")
	}
	want(t, r, "passthrough", OK, "no NVIDIA GPU bound to vfio-pci")
	want(t, r, "sriov", OK, "1 PF with 4 VFs; 1 offered, 0 not", "0000:17:00.0", "offered shared")
	want(t, r, "nri", OK, "the runtime's NRI socket")
	want(t, r, "kubelet-dirs", OK)
	want(t, r, "cdi-dir", OK, "(the agent makes it)")
	want(t, r, "state-dir", OK, "none yet")
	want(t, r, "api-server", Skip, "no kubeconfig")
	want(t, r, "dra-api", Skip)
	want(t, r, "dra-features", Skip)
}

// TestDriverWithoutPrograms: a driver root with NVML but without the
// driver's programs warns what fails and how to give the right root.
func TestDriverWithoutPrograms(t *testing.T) {
	n := open(t, "gpus: [{model: h100-80gb, count: 1}]\ndriver: {root: /usr/local/nvidia, noPrograms: true}\n")
	r := Run(context.Background(), input(t, n))
	want(t, r, "driver-root", Warn, "/usr/local/nvidia (flat layout)", "MPS claims, GPU shares and time-sliced claims fail without nvidia-smi and nvidia-cuda-mps-control", "--nvidia-driver-root")
	if r.Count(Blocker) != 0 {
		t.Errorf("blockers:\n%s", text(t, r))
	}
}

// TestVersionMismatch: a kernel module of another version than the
// driver root's libraries blocks, both ways it happens: a driver upgraded
// without a reboot (the old module still loaded), and a root holding
// another driver's libraries (so the running one's cannot be given to
// containers either).
func TestVersionMismatch(t *testing.T) {
	t.Run("module", func(t *testing.T) {
		n := open(t, gpuNIC)
		file := filepath.Join(n.ProcRoot, moduleVersionFile)
		if err := os.WriteFile(file, []byte("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		r := Run(context.Background(), input(t, n))
		want(t, r, "driver-version", Blocker, "the kernel module is 535.104.05",
			"libnvidia-ml.so.1 is 550.54.15's", "no libcuda.so.535.104.05 in the root's library folders (only 550.54.15)", "NVML reports driver 550.54.15", "reboot")
	})
	t.Run("libraries", func(t *testing.T) {
		n := open(t, gpuNIC)
		lib := filepath.Join(n.Mock().DriverRoot(), "usr/lib/x86_64-linux-gnu")
		entries, err := os.ReadDir(lib)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if err := os.Remove(filepath.Join(lib, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
		if err := drivertools.InstallLibraries(lib, "580.95.05"); err != nil {
			t.Fatal(err)
		}
		r := Run(context.Background(), input(t, n))
		want(t, r, "driver-version", Blocker, "the kernel module is 550.54.15", "libnvidia-ml.so.1 is 580.95.05's",
			"no libcuda.so.550.54.15 in the root's library folders (only 580.95.05)", "--nvidia-driver-root")
		want(t, r, "driver-files", Blocker, "containers get no CUDA", "550.54.15")
	})
}

// writeToolkitSpec writes the NVIDIA Container Toolkit's spec into the
// mock node's /etc/cdi, mounting libcuda of a driver version.
func writeToolkitSpec(t *testing.T, n *backend.Node, version string) string {
	t.Helper()
	path := filepath.Join(n.Mock().HostRoot(), "etc", "cdi", "nvidia.yaml")
	spec := "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [{name: all, containerEdits: {env: [A=1]}}]\ncontainerEdits:\n  mounts:\n" +
		"  - {hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so." + version + ", containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so." + version + "}\n"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestToolkitSpec: the toolkit's spec of the running driver is where
// containers' files come from; a stale one is said, with its version, and
// containers get generated files; an unreadable one is said.
func TestToolkitSpec(t *testing.T) {
	n := open(t, gpuNIC)
	path := writeToolkitSpec(t, n, "550.54.15")
	r := Run(context.Background(), input(t, n))
	want(t, r, "driver-files", OK, "from the NVIDIA Container Toolkit's spec "+path+" (driver 550.54.15): 1 mount, libcuda among them")

	writeToolkitSpec(t, n, "535.104.05")
	r = Run(context.Background(), input(t, n))
	want(t, r, "driver-files", Warn, "generated from the driver root", "the toolkit's spec "+path+" is stale (driver 535.104.05)", "nvidia-ctk cdi generate")

	if err := os.WriteFile(path, []byte("kind: [nope"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = Run(context.Background(), input(t, n))
	want(t, r, "driver-files", Warn, "generated from the driver root", "unreadable CDI spec, passed over: "+path)
}

// TestHook: without a hook given, shipped or installed by an agent, the
// generated files' hooks cannot run: warned; one an agent installed into
// its state folder counts.
func TestHook(t *testing.T) {
	n := open(t, gpuNIC)
	in := input(t, n)
	in.CDIHook = ""
	r := Run(context.Background(), in)
	want(t, r, "nvidia-cdi-hook", Warn, "no nvidia-cdi-hook", "--nvidia-cdi-hook")
	installed := filepath.Join(in.Paths.StateDir, "bin", "nvidia-cdi-hook")
	if err := os.MkdirAll(filepath.Dir(installed), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(installed, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	r = Run(context.Background(), in)
	want(t, r, "nvidia-cdi-hook", OK, "installed by the agent: "+installed)
}

// TestMIGPending: an A100 whose MIG mode was switched waits for a reset
// (Ampere): warned, naming the GPU. (Hopper switches at once: nothing
// pends.)
func TestMIGPending(t *testing.T) {
	n := open(t, "gpus: [{model: a100-40gb, count: 2}]\n")
	dev, ret := n.Mock().NVML.DeviceGetHandleByIndex(1)
	if ret != gonvml.SUCCESS {
		t.Fatal(ret)
	}
	if act, ret := dev.SetMigMode(gonvml.DEVICE_MIG_ENABLE); ret != gonvml.SUCCESS || act != gonvml.ERROR_RESET_REQUIRED {
		t.Fatalf("switching MIG on an A100: %v, activation %v", ret, act)
	}
	r := Run(context.Background(), input(t, n))
	c := want(t, r, "mig-mode", Warn, "a MIG mode change waits for a GPU reset on 0000:43:00.0", "nvidia-smi -r")
	if !slices.Contains(c.Details, "0000:43:00.0: MIG off, on after a reset (pending)") || !slices.Contains(c.Details, "0000:1b:00.0: MIG off") {
		t.Errorf("details: %q", c.Details)
	}
}

// TestComputeModes: under Manage a Default GPU is fine and a Prohibited
// one warns; under Leave both warn, each with what it costs.
func TestComputeModes(t *testing.T) {
	n := open(t, "gpus: [{model: h100-80gb, count: 2}]\n")
	leave, err := config.Parse([]byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\ngpus: {settings: Leave}\n"))
	if err != nil {
		t.Fatal(err)
	}
	in := input(t, n)
	r := Run(context.Background(), in)
	want(t, r, "compute-mode", OK, "gpus.settings Manage; compute mode Default on 2")

	in.Config = leave
	r = Run(context.Background(), in)
	want(t, r, "compute-mode", Warn, "gpus.settings Leave", "bypasses", "whole GPU", "EXCLUSIVE_PROCESS")
	want(t, r, "mig-mode", OK, "no MIG partition offered")

	if err := n.GPU().SetComputeMode("0000:1b:00.0", nvml.ComputeProhibited); err != nil {
		t.Fatal(err)
	}
	r = Run(context.Background(), in)
	want(t, r, "compute-mode", Warn, "Prohibited on 0000:1b:00.0: no process may use them, so no MPS claim or GPU share", "Default on 1")
	in.Config = nil
	r = Run(context.Background(), in)
	c := want(t, r, "compute-mode", Warn, "Prohibited on 0000:1b:00.0: claims without sharing run nothing there")
	if strings.Contains(c.Summary, "bypasses") {
		t.Errorf("Manage, and yet: %s", c.Summary)
	}
}

// TestMPSDaemons: the MPS control daemons in the node's proc are listed,
// with their pipe folders; other processes are not.
func TestMPSDaemons(t *testing.T) {
	n := open(t, "gpus: [{model: h100-80gb, count: 1}]\n")
	for pid, cmdline := range map[string]string{
		"4242": "/usr/bin/nvidia-cuda-mps-control\x00-d\x00", "4243": "nvidia-cuda-mps-server\x00", "17": "/bin/sh\x00",
	} {
		dir := filepath.Join(n.ProcRoot, pid)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(cmdline), 0o444); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "environ"), []byte("A=1\x00CUDA_MPS_PIPE_DIRECTORY=/var/lib/hwdra/mps/x/pipe\x00"), 0o400); err != nil {
			t.Fatal(err)
		}
	}
	r := Run(context.Background(), input(t, n))
	c := want(t, r, "mps-daemons", OK, "1 MPS control daemon running: pid 4242")
	if !slices.Equal(c.Details, []string{"pid 4242: /usr/bin/nvidia-cuda-mps-control -d, pipes in /var/lib/hwdra/mps/x/pipe"}) {
		t.Errorf("details %q", c.Details)
	}
}

// TestDeviceNodes: a GPU's device node missing on the node, or no
// character device, warns (the agent still gives it by number); with
// nvidia-uvm missing and its module not loaded every GPU claim fails:
// blocks. Mock hardware not run as root makes no device nodes: skipped.
func TestDeviceNodes(t *testing.T) {
	n := open(t, "gpus: [{model: h100-80gb, count: 1}]\n")
	in := input(t, n)
	if !n.NoDevNodes {
		want(t, Run(context.Background(), in), "device-nodes", OK, "4 device nodes")
	}
	noNodes := n.NoDevNodes
	n.NoDevNodes = true
	want(t, Run(context.Background(), in), "device-nodes", Skip, "not run as root")
	n.NoDevNodes = false

	for _, name := range []string{"nvidiactl", "nvidia0"} {
		path := filepath.Join(n.GPUDevRoot, name)
		if err := os.Remove(path); err != nil && !noNodes {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(n.GPUDevRoot, "nvidiactl"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c := want(t, Run(context.Background(), in), "device-nodes", Warn, "nvidiactl", "nvidia0", "missing under "+n.GPUDevRoot, "nvidia-modprobe")
	if !slices.Contains(c.Details, filepath.Join(n.GPUDevRoot, "nvidiactl")+": not a character device") ||
		!slices.Contains(c.Details, filepath.Join(n.GPUDevRoot, "nvidia0")+": missing") {
		t.Errorf("details %q", c.Details)
	}

	if err := os.Remove(filepath.Join(n.GPUDevRoot, "nvidia-uvm")); err != nil && !noNodes {
		t.Fatal(err)
	}
	devices := filepath.Join(n.ProcRoot, "devices")
	raw, err := os.ReadFile(devices)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(devices, []byte(strings.ReplaceAll(string(raw), "nvidia-uvm\n", "")), 0o644); err != nil {
		t.Fatal(err)
	}
	want(t, Run(context.Background(), in), "device-nodes", Blocker, "no nvidia-uvm", "every GPU claim fails", "nvidia-modprobe -u -c=0")
}

// TestPassthrough: GPUs bound to vfio-pci in viable IOMMU groups are
// fine; a group with a function on another driver warns; with the IOMMU
// off (no groups) they block.
func TestPassthrough(t *testing.T) {
	n := open(t, "gpus: [{model: h100-80gb, count: 1, virtualization: passthrough}]\n")
	in := input(t, n)
	r := Run(context.Background(), in)
	want(t, r, "passthrough", OK, "1 GPU bound to vfio-pci, IOMMU on", "0000:1b:00.0", "viable")
	want(t, r, "nvml", OK, "no GPU for the NVIDIA driver")
	if r.Count(Blocker)+r.Count(Warn) != 0 {
		t.Errorf("passthrough node:\n%s", text(t, r))
	}

	// The board's audio function in the GPU's group, on its sound driver.
	sysfs := n.SysfsRoot
	group, err := filepath.EvalSymlinks(filepath.Join(sysfs, "bus/pci/devices/0000:1b:00.0/iommu_group"))
	if err != nil {
		t.Fatal(err)
	}
	audio := filepath.Join(sysfs, "devices/pci0000:10/0000:1b:00.1")
	snd := filepath.Join(sysfs, "bus/pci/drivers/snd_hda_intel")
	for _, d := range []string{audio, snd} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(snd, filepath.Join(audio, "driver")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(audio, filepath.Join(group, "devices", "0000:1b:00.1")); err != nil {
		t.Fatal(err)
	}
	want(t, Run(context.Background(), in), "passthrough", Warn, "not viable", "0000:1b:00.1 (snd_hda_intel)", "bind every function")

	// The IOMMU off: the kernel groups nothing.
	if err := os.RemoveAll(filepath.Join(sysfs, "kernel/iommu_groups")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(sysfs, "bus/pci/devices/0000:1b:00.0/iommu_group")); err != nil {
		t.Fatal(err)
	}
	want(t, Run(context.Background(), in), "passthrough", Blocker, "1 GPU bound to vfio-pci (0000:1b:00.0), but the IOMMU is off", "intel_iommu=on")
}

// TestVFIONoIOMMU: VFIO groups without an IOMMU are named with their
// devices, and the report says whether the agent refuses or hands them
// out (vfio.allowUnsafeNoIOMMU).
func TestVFIONoIOMMU(t *testing.T) {
	want(t, Run(context.Background(), input(t, open(t, "gpus: [{model: h100-80gb, count: 1, virtualization: passthrough}]\n"))),
		"vfio-noiommu", OK, "no VFIO group without an IOMMU")
	n := open(t, "noIOMMU: true\ngpus: [{model: h100-80gb, count: 1, virtualization: passthrough}]\nnics: [{model: e810, count: 1, vfs: 1, vfDriver: vfio-pci}]\n")
	in := input(t, n)
	want(t, Run(context.Background(), in), "vfio-noiommu", Warn, "2 VFIO groups without an IOMMU", "DMA into all of the node's memory",
		"claims for their devices are refused", "/dev/vfio/noiommu-", "0000:1b:00.0", "intel_iommu=on")
	cfg, err := config.Parse([]byte("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\nvfio: {allowUnsafeNoIOMMU: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	in.Config = cfg
	want(t, Run(context.Background(), in), "vfio-noiommu", Warn, "the agent hands them to claims (vfio.allowUnsafeNoIOMMU)", "set vfio.allowUnsafeNoIOMMU false")
}

// TestNICOnly: a node with NICs and no GPU checks its NICs and NRI and
// skips the GPU checks; VFs bound to no network driver are no shares;
// without NRI its VF pods get no interface.
func TestNICOnly(t *testing.T) {
	n := open(t, "nics: [{model: cx7, count: 2, vfs: 4, pciAddresses: [\"0000:17:00.0\", \"0000:b1:00.0\"]}]\n")
	in := input(t, n)
	r := Run(context.Background(), in)
	if r.Count(Blocker)+r.Count(Warn) != 0 {
		t.Errorf("NIC-only node:\n%s", text(t, r))
	}
	want(t, r, "nvml", OK, "no GPU for the NVIDIA driver")
	for _, id := range []string{"driver-root", "driver-version", "driver-files", "nvidia-cdi-hook", "mig-mode", "compute-mode", "mps-daemons", "device-nodes"} {
		want(t, r, id, Skip, noDriverNeeded)
	}
	want(t, r, "sriov", OK, "2 PFs with 8 VFs; 2 offered, 0 not")

	in.Paths.NRISocket = filepath.Join(t.TempDir(), "none.sock")
	want(t, Run(context.Background(), in), "nri", Warn, "no NRI socket at "+in.Paths.NRISocket, "refuses NIC claims", "--nri-socket")
	in.Paths.NRISocket = ""
	want(t, Run(context.Background(), in), "nri", Warn, "NRI off (--nri-socket empty)")

	n = open(t, "nics: [{model: cx7, count: 1, vfs: 4, vfDriver: vfio-pci, pciAddresses: [\"0000:17:00.0\"]}]\n")
	in = input(t, n)
	want(t, Run(context.Background(), in), "sriov", Warn, "VFs bound to no network driver are not offered as shares: 0000:17:00.0 (4 of 4)", "exclusive")

	// No PF: no NRI needed.
	n = open(t, "gpus: [{model: h100-80gb, count: 1}]\n")
	in = input(t, n)
	in.Paths.NRISocket = ""
	want(t, Run(context.Background(), in), "nri", OK, "no PF offered needs it")
}

// TestNoDriver: NVIDIA GPUs on the PCI bus whose driver is not loaded
// block, saying where the driver was looked for and what to do; the
// checks that need NVML say why they wait.
func TestNoDriver(t *testing.T) {
	t.Setenv(persist.DirEnv, t.TempDir())
	spec := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(spec, []byte("gpus: [{model: h100-80gb, count: 2}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := mocktest.Open(t, spec) // the hardware before the agent: driver not loaded
	if err := h.SetDriverLoaded(false); err != nil {
		t.Fatal(err)
	}
	h.Close()
	n := open(t, "gpus: [{model: h100-80gb, count: 2}]\n")
	if !n.NVMLPending() {
		t.Fatal("NVML is not pending")
	}
	r := Run(context.Background(), input(t, n))
	want(t, r, "nvml", Blocker, "NVIDIA GPUs on the PCI bus, but NVML does not start", "load the NVIDIA driver", "driver container", "--nvidia-driver-root", "tried /run/nvidia/driver: no libnvidia-ml.so.1")
	want(t, r, "driver-version", Blocker, "the NVIDIA kernel module is not loaded")
	for _, id := range []string{"driver-files", "nvidia-cdi-hook", "mig-mode", "compute-mode", "device-nodes"} {
		want(t, r, id, Skip, "NVML is not up")
	}
}

// TestKubeletAndFolders: the agent does not start without the kubelet's
// plugin registry, nor with a CDI or state folder it cannot make; a
// plugins folder the agent would make warns; state files set aside are
// said.
func TestKubeletAndFolders(t *testing.T) {
	n := open(t, "nics: [{model: cx7, count: 1, vfs: 2}]\n")
	in := input(t, n)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	in.Paths.PluginsDir = filepath.Join(t.TempDir(), "plugins")
	want(t, Run(context.Background(), in), "kubelet-dirs", Warn, "plugins folder "+in.Paths.PluginsDir+": no such folder", "--root-dir")
	in.Paths.RegistrarDir = filepath.Join(t.TempDir(), "plugins_registry")
	want(t, Run(context.Background(), in), "kubelet-dirs", Blocker, "--kubelet-registrar-dir "+in.Paths.RegistrarDir+": no such folder: the agent does not start", "kubeletRootDir")
	in.Paths.RegistrarDir = file
	want(t, Run(context.Background(), in), "kubelet-dirs", Blocker, "not a folder")

	in.Paths.CDIDir = filepath.Join(file, "cdi")
	want(t, Run(context.Background(), in), "cdi-dir", Blocker, file+" is a file, not a folder", "cdi_spec_dirs")
	in.Paths.StateDir = filepath.Join(file, "state")
	want(t, Run(context.Background(), in), "state-dir", Blocker, file+" is a file, not a folder", "stateDir")

	in.Paths.StateDir = t.TempDir()
	for _, f := range []string{"gpu.hwdra.io.ledger.json", "gpu.hwdra.io.checkpoint.json.corrupt-20260101T000000"} {
		if err := os.WriteFile(filepath.Join(in.Paths.StateDir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want(t, Run(context.Background(), in), "state-dir", Warn, "1 state file; 1 file set aside as unreadable: gpu.hwdra.io.checkpoint.json.corrupt-20260101T000000")
}

// TestJSON: the report's JSON has the documented shape and reads back
// as it was written.
func TestJSON(t *testing.T) {
	n := open(t, "gpus: [{model: a100-40gb, count: 1}]\n")
	in := input(t, n)
	in.Paths.RegistrarDir = filepath.Join(t.TempDir(), "none")
	r := Run(context.Background(), in)
	out, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(out, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, r) {
		t.Errorf("read back:\n%+v\nwritten:\n%+v", back, r)
	}
	var shape struct {
		Checks []map[string]any `json:"checks"`
	}
	if err := json.Unmarshal(out, &shape); err != nil {
		t.Fatal(err)
	}
	for _, c := range shape.Checks {
		for k := range c {
			if !slices.Contains([]string{"id", "status", "summary", "details", "fix"}, k) {
				t.Errorf("undocumented field %q in %v", k, c)
			}
		}
		if c["id"] == "kubelet-dirs" && (c["status"] != "BLOCKER" || c["fix"] == nil) {
			t.Errorf("kubelet-dirs: %v", c)
		}
	}
	if len(shape.Checks) != len(ids) {
		t.Errorf("%d checks in the JSON", len(shape.Checks))
	}
}

// TestChecksAsDocumented: the operator guide's table names every check,
// and its sample run shows them in the order they run.
func TestChecksAsDocumented(t *testing.T) {
	raw, err := os.ReadFile("../../../docs/operator-guide.md")
	if err != nil {
		t.Fatal(err)
	}
	guide := string(raw)
	start := strings.Index(guide, "## Checking a node: hwdra doctor")
	end := strings.Index(guide[start:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal("no section \"Checking a node: hwdra doctor\" in the operator guide")
	}
	section := guide[start : start+end]
	var sample []string
	for _, line := range strings.Split(section, "\n") {
		if f := strings.Fields(line); len(f) > 1 && slices.Contains([]string{"OK", "WARN", "BLOCKER", "SKIP"}, f[0]) {
			sample = append(sample, f[1])
		}
	}
	if !slices.Equal(sample, ids) {
		t.Errorf("the sample run shows %v, the checks are %v", sample, ids)
	}
	for _, id := range ids {
		if !strings.Contains(section, "| `"+id+"`") && !strings.Contains(section, "`"+id+"` |") && !strings.Contains(section, "`"+id+"`, ") {
			t.Errorf("the table does not name %s", id)
		}
	}
}

// TestLostGPU: a GPU NVML cannot read (fallen off the bus) warns,
// naming it (a lost GPU answers nothing, not even its address); the
// others are checked.
func TestLostGPU(t *testing.T) {
	n := open(t, "gpus: [{model: h100-80gb, count: 2}]\n")
	if err := n.Mock().Inject(fault.Fault{Kind: fault.GPULost, GPU: "0000:43:00.0"}); err != nil {
		t.Fatal(err)
	}
	r := Run(context.Background(), input(t, n))
	want(t, r, "nvml", Warn, "1 GPU, driver 550.54.15", "1 GPU could not be read", "GPU 1: unreadable: fallen off the bus", "tainted")
	want(t, r, "compute-mode", OK, "Default on 1")
}
