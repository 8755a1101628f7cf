// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/backend/vfiopci"
)

// The GPUs: their MIG and compute modes against gpus.settings, the MPS
// daemons running, their device nodes, and those bound to vfio-pci.

// migMode: each GPU's MIG mode; one whose mode changes at the next reset
// (current != pending) is offered in its current mode until then.
func (r *run) migMode(context.Context) Check {
	c := Check{ID: "mig-mode"}
	if r.skipWithoutNVML(&c) {
		return c
	}
	leave := !r.in.Config.GPUPolicy().ManagesSettings()
	on, off, capable := 0, 0, 0
	var pending []string
	for _, g := range r.gpus {
		if !g.MIG.Capable {
			c.Details = append(c.Details, g.PCIBusID+": no MIG")
			continue
		}
		capable++
		d := fmt.Sprintf("%s: MIG %s", g.PCIBusID, onOff(g.MIG.Enabled))
		if g.MIG.Enabled {
			on++
		} else {
			off++
			if leave {
				d += " (gpus.settings Leave: no MIG partition offered)"
			}
		}
		if g.MIG.Pending != g.MIG.Enabled {
			d += fmt.Sprintf(", %s after a reset (pending)", onOff(g.MIG.Pending))
			pending = append(pending, g.PCIBusID)
		}
		c.Details = append(c.Details, d)
	}
	c.Status = OK
	c.Summary = fmt.Sprintf("%s, %d MIG-capable: MIG enabled on %d, disabled on %d", plural(len(r.gpus), "GPU", "GPUs"), capable, on, off)
	if len(pending) > 0 {
		c.Status = Warn
		c.Summary += fmt.Sprintf("; a MIG mode change waits for a GPU reset on %s: offered in the current mode until then", strings.Join(pending, ", "))
		c.Fix = "reset each such GPU once idle (nvidia-smi -r -i <PCI address>) or reboot the node; or set the mode back (nvidia-smi -mig 0|1 -i <PCI address>)"
	}
	return c
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// computeMode: each GPU's compute mode, against gpus.settings: under
// Leave the agent keeps the mode the GPU has, so a Prohibited GPU serves
// no MPS claim or share, and in Default a process that bypasses an MPS
// daemon gets the whole GPU.
func (r *run) computeMode(context.Context) Check {
	c := Check{ID: "compute-mode"}
	if r.skipWithoutNVML(&c) {
		return c
	}
	settings := r.in.Config.GPUPolicy().Settings()
	leave := settings == config.SettingsLeave
	modes := map[nvml.ComputeMode][]string{}
	var fixes []string
	c.Status = OK
	for _, g := range r.gpus {
		mode, err := r.gpu.ComputeMode(g.PCIBusID)
		if err != nil {
			if c.Status != Warn {
				fixes = append(fixes, "look at the GPUs whose mode cannot be read (nvidia-smi -q -i <PCI address>)")
			}
			c.Status = Warn
			c.Details = append(c.Details, g.PCIBusID+": "+err.Error())
			continue
		}
		modes[mode] = append(modes[mode], g.PCIBusID)
		c.Details = append(c.Details, fmt.Sprintf("%s: %s", g.PCIBusID, mode))
	}
	var names []string
	for _, m := range []nvml.ComputeMode{nvml.ComputeDefault, nvml.ComputeExclusiveProcess, nvml.ComputeProhibited} {
		if len(modes[m]) > 0 {
			names = append(names, fmt.Sprintf("%s on %d", m, len(modes[m])))
		}
	}
	c.Summary = fmt.Sprintf("gpus.settings %s; compute mode %s", settings, strings.Join(names, ", "))
	if p := modes[nvml.ComputeProhibited]; len(p) > 0 {
		c.Status = Warn
		if leave {
			c.Summary += fmt.Sprintf("; Prohibited on %s: no process may use them, so no MPS claim or GPU share (nor any claim) runs there, and under Leave the agent does not change it", strings.Join(p, ", "))
		} else {
			c.Summary += fmt.Sprintf("; Prohibited on %s: claims without sharing run nothing there (the agent changes the mode for MPS and time-sliced claims only)", strings.Join(p, ", "))
		}
		fixes = append(fixes, "set Default or ExclusiveProcess with the tool that owns the GPU's settings (nvidia-smi -c DEFAULT|EXCLUSIVE_PROCESS -i <PCI address>)")
	}
	if d := modes[nvml.ComputeDefault]; leave && len(d) > 0 {
		c.Status = Warn
		c.Summary += fmt.Sprintf("; under Leave, MPS claims and GPU shares on the %d in Default mode are limits only for processes that use the MPS daemon: one that bypasses it gets a context on the whole GPU, outside every client's limits", len(d))
		fixes = append(fixes, "set the GPUs meant for MPS and shares to ExclusiveProcess with the tool that owns their settings (nvidia-smi -c EXCLUSIVE_PROCESS -i <PCI address>)")
	}
	c.Fix = strings.Join(fixes, "; ")
	return c
}

// mpsProgram is the MPS control daemon's program name.
const mpsProgram = "nvidia-cuda-mps-control"

// mpsDaemons: the MPS control daemons running on the node, from its
// proc: the agent's (one per MPS claim or shared GPU) and any other.
func (r *run) mpsDaemons(context.Context) Check {
	c := Check{ID: "mps-daemons"}
	if r.gpu == nil && !r.pendingNVML() {
		c.Status, c.Summary = Skip, noDriverNeeded
		return c
	}
	proc := r.in.Node.ProcRoot
	entries, err := os.ReadDir(proc)
	if err != nil {
		c.Status, c.Summary = Warn, "cannot list the node's processes: "+err.Error()
		return c
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// Its command line's program: comm is cut to 15 characters, which
		// the MPS server's name shares.
		cmdline, err := os.ReadFile(filepath.Join(proc, e.Name(), "cmdline"))
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if err != nil || filepath.Base(args[0]) != mpsProgram {
			continue
		}
		pids = append(pids, pid)
		d := fmt.Sprintf("pid %d: %s", pid, strings.Join(args, " "))
		if env, err := os.ReadFile(filepath.Join(proc, e.Name(), "environ")); err == nil {
			for _, kv := range bytes.Split(env, []byte{0}) {
				if v, ok := bytes.CutPrefix(kv, []byte("CUDA_MPS_PIPE_DIRECTORY=")); ok {
					d += ", pipes in " + string(v)
				}
			}
		}
		c.Details = append(c.Details, d)
	}
	sort.Ints(pids)
	sort.Strings(c.Details)
	c.Status = OK
	if len(pids) == 0 {
		c.Summary = "no MPS control daemon runs"
		return c
	}
	c.Summary = fmt.Sprintf("%s running: pid %s", plural(len(pids), "MPS control daemon", "MPS control daemons"), strings.Trim(fmt.Sprint(pids), "[]"))
	return c
}

// deviceNodes: the GPUs' device nodes under the GPU device root. One the
// agent can name by its numbers is given to containers even where the
// node lacks it (the runtime creates it); nvidia-uvm without its module
// loaded cannot be, and blocks every GPU claim.
func (r *run) deviceNodes(context.Context) Check {
	c := Check{ID: "device-nodes"}
	n := r.in.Node
	if r.skipWithoutNVML(&c) {
		return c
	}
	if n.NoDevNodes {
		c.Status, c.Summary = Skip, "mock hardware not run as root: it makes no device nodes to look at under "+n.GPUDevRoot
		return c
	}
	names := []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
	for _, g := range r.gpus {
		names = append(names, fmt.Sprintf("nvidia%d", g.Minor))
	}
	_, err := nvml.CharDriverMajor(n.ProcRoot, "nvidia-uvm")
	uvm := err == nil
	var missing, blocked []string
	for _, name := range names {
		path := filepath.Join(n.GPUDevRoot, name)
		var st unix.Stat_t
		err := unix.Stat(path, &st)
		switch {
		case err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR:
			continue
		case err == nil:
			c.Details = append(c.Details, path+": not a character device")
		case errors.Is(err, fs.ErrNotExist):
			c.Details = append(c.Details, path+": missing")
		default:
			c.Details = append(c.Details, path+": "+err.Error())
		}
		if strings.HasPrefix(name, "nvidia-uvm") && !uvm {
			blocked = append(blocked, name)
		} else {
			missing = append(missing, name)
		}
	}
	switch {
	case len(blocked) > 0:
		c.Status = Blocker
		c.Summary = fmt.Sprintf("no %s under %s and no nvidia-uvm driver in %s: every GPU claim fails to prepare", strings.Join(blocked, ", "), n.GPUDevRoot, filepath.Join(n.ProcRoot, "devices"))
		c.Fix = "load the nvidia-uvm module: nvidia-modprobe -u -c=0 (or modprobe nvidia-uvm); the GPU operator's driver container does"
	case len(missing) > 0:
		c.Status = Warn
		c.Summary = fmt.Sprintf("%s missing under %s: containers still get them (the agent names them by their numbers, the runtime creates them), but tools on the node do not find them", strings.Join(missing, ", "), n.GPUDevRoot)
		c.Fix = "nvidia-modprobe -c=<minor> -u (or NVML run as root) makes them; check that the GPU device root is the driver's (--nvidia-driver-root)"
	default:
		c.Status = OK
		c.Summary = fmt.Sprintf("%s under %s", plural(len(names), "device node", "device nodes"), n.GPUDevRoot)
	}
	return c
}

// passthrough: the NVIDIA GPUs bound to vfio-pci need the IOMMU on, and
// each its IOMMU group viable (every function in it on a VFIO driver),
// for a VM to take it.
func (r *run) passthrough(context.Context) Check {
	c := Check{ID: "passthrough"}
	sysfs := r.in.Node.SysfsRoot
	bound := vfioGPUs(sysfs)
	if len(bound) == 0 {
		c.Status, c.Summary = OK, "no NVIDIA GPU bound to vfio-pci"
		return c
	}
	groups, _ := os.ReadDir(filepath.Join(sysfs, "kernel", "iommu_groups"))
	if len(groups) == 0 {
		c.Status = Blocker
		c.Summary = fmt.Sprintf("%s bound to vfio-pci (%s), but the IOMMU is off (no %s): no VM can take them", plural(len(bound), "GPU", "GPUs"), strings.Join(bound, ", "), filepath.Join(sysfs, "kernel", "iommu_groups"))
		c.Fix = "turn the IOMMU on: VT-d or AMD-Vi in the firmware, intel_iommu=on (Intel; amd_iommu is on by default) on the kernel command line, then reboot"
		return c
	}
	if r.in.Node.Passthrough == nil {
		c.Status, c.Summary = Skip, "GPUs bound to vfio-pci, but no scanner for them"
		return c
	}
	gpus, err := r.in.Node.Passthrough.GPUs()
	if err != nil {
		c.Status = Blocker
		c.Summary = "GPUs bound to vfio-pci cannot be offered: " + err.Error()
		c.Fix = "turn the IOMMU on for every device (VT-d or AMD-Vi in the firmware, intel_iommu=on), then reboot"
		return c
	}
	var bad []string
	for _, g := range gpus {
		if err := vfiopci.GroupViable(sysfs, g.IOMMUGroup); err != nil {
			bad = append(bad, g.PCIBusID)
			c.Details = append(c.Details, g.PCIBusID+": "+err.Error())
			continue
		}
		c.Details = append(c.Details, fmt.Sprintf("%s (%s): IOMMU group %d, viable", g.PCIBusID, g.ProductName, g.IOMMUGroup))
	}
	c.Status = OK
	c.Summary = fmt.Sprintf("%s bound to vfio-pci, IOMMU on (%s)", plural(len(gpus), "GPU", "GPUs"), plural(len(groups), "group", "groups"))
	if len(bad) > 0 {
		c.Status = Warn
		c.Summary += fmt.Sprintf("; the IOMMU group of %s is not viable: their passthrough claims fail to prepare", strings.Join(bad, ", "))
		c.Fix = "bind every function in the group to vfio-pci too (the board's audio function as well), or unbind it"
	}
	return c
}

// vfioNoIOMMU: a kernel that runs VFIO without an IOMMU (the vfio
// module's enable_unsafe_noiommu_mode) gives whoever opens a group
// (/dev/vfio/noiommu-<N>) DMA into all of the node's memory. The agent
// refuses claims for devices in such groups unless vfio.allowUnsafeNoIOMMU
// says otherwise; either way an operator should know.
func (r *run) vfioNoIOMMU(context.Context) Check {
	c := Check{ID: "vfio-noiommu"}
	groups, err := vfiopci.NoIOMMUGroups(r.in.Node.SysfsRoot)
	if err != nil {
		c.Status, c.Summary = Warn, "cannot list the VFIO groups: "+err.Error()
		return c
	}
	if len(groups) == 0 {
		c.Status, c.Summary = OK, "no VFIO group without an IOMMU"
		return c
	}
	for _, n := range slices.Sorted(maps.Keys(groups)) {
		c.Details = append(c.Details, fmt.Sprintf("/dev/vfio/noiommu-%d: %s", n, strings.Join(groups[n], ", ")))
	}
	c.Status = Warn
	what := plural(len(groups), "VFIO group", "VFIO groups") + " without an IOMMU (the vfio module's enable_unsafe_noiommu_mode): whoever opens one can DMA into all of the node's memory"
	if r.in.Config.AllowsUnsafeNoIOMMU() {
		c.Summary = what + "; the agent hands them to claims (vfio.allowUnsafeNoIOMMU)"
		c.Fix = "turn the IOMMU on (VT-d or AMD-Vi in the firmware, intel_iommu=on) and vfio's enable_unsafe_noiommu_mode off, then reboot; until then set vfio.allowUnsafeNoIOMMU false"
	} else {
		c.Summary = what + "; claims for their devices are refused at prepare (vfio.allowUnsafeNoIOMMU is off)"
		c.Fix = "turn the IOMMU on (VT-d or AMD-Vi in the firmware, intel_iommu=on) and vfio's enable_unsafe_noiommu_mode off, then reboot"
	}
	return c
}

// vfioGPUs are the NVIDIA display and 3D controllers the PCI bus has on
// vfio-pci, whether or not the IOMMU groups them.
func vfioGPUs(sysfs string) []string {
	dir := filepath.Join(sysfs, "bus", "pci", "devices")
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		vendor, _ := os.ReadFile(filepath.Join(dir, e.Name(), "vendor"))
		class, _ := os.ReadFile(filepath.Join(dir, e.Name(), "class"))
		driver, _ := os.Readlink(filepath.Join(dir, e.Name(), "driver"))
		if strings.TrimSpace(string(vendor)) == "0x10de" && strings.HasPrefix(strings.TrimSpace(string(class)), "0x03") &&
			filepath.Base(driver) == vfiopci.Driver {
			out = append(out, e.Name())
		}
	}
	return out
}
