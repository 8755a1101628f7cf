// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/backend/driverlibs"
	"github.com/hwdra/hwdra/internal/backend/nvml"
)

// The NVIDIA driver: NVML, its root and programs, the kernel module's
// version against the libraries', the files containers get and the hook
// they need.

const fixNoNVML = "load the NVIDIA driver (nvidia-smi on the node lists the GPUs once it is); with the GPU operator, wait for its driver container to be ready (the agent waits too, and starts its GPU driver then); where the driver is installed elsewhere, give its root with --nvidia-driver-root (chart: nvidiaDriverRoot)"

// nvml: NVML is up, from which library, of which driver and CUDA
// version, with how many GPUs; GPUs on the PCI bus but no NVML blocks.
func (r *run) nvml(context.Context) Check {
	c := Check{ID: "nvml"}
	d := r.in.Node.Driver()
	switch {
	case r.gpu != nil:
		lib := d.NVML
		if d.Root.Mount == "/" {
			lib = "libnvidia-ml.so.1 through the dynamic loader's search"
		}
		c.Status = OK
		c.Summary = fmt.Sprintf("NVML (%s): %s", lib, plural(len(r.gpus), "GPU", "GPUs"))
		if len(r.gpus) > 0 {
			g := r.gpus[0]
			c.Summary += fmt.Sprintf(", driver %s, CUDA %s", g.DriverVersion, g.CUDADriverVersion)
		}
		for _, g := range r.gpus {
			c.Details = append(c.Details, fmt.Sprintf("GPU %d %s: %s, minor %d", g.Index, g.PCIBusID, g.ProductName, g.Minor))
		}
		if unreadable := nvml.Unreadable(r.gpusErr); len(unreadable) > 0 || r.gpusErr != nil && len(r.gpus) == 0 {
			c.Status = Warn
			c.Summary += fmt.Sprintf("; %s could not be read", plural(len(unreadable), "GPU", "GPUs"))
			for _, u := range unreadable {
				lost := ""
				if u.Lost {
					lost = "fallen off the bus: "
				}
				c.Details = append(c.Details, strings.TrimSpace(fmt.Sprintf("GPU %d %s", u.Index, u.PCIBusID))+": unreadable: "+lost+u.Error)
			}
			if len(unreadable) == 0 {
				c.Details = append(c.Details, "error: "+r.gpusErr.Error())
			}
			c.Fix = "the agent publishes an unreadable GPU tainted, the others serve: look at the GPU (nvidia-smi -q -i <PCI address>; the kernel log for XIDs), reset or replace it"
		}
	case r.pendingNVML():
		c.Status = Blocker
		c.Summary = "NVIDIA GPUs on the PCI bus, but NVML does not start: " + r.nvmlErr.Error()
		c.Details = append(c.Details, d.String())
		c.Details = append(c.Details, triedRoots(d)...)
		c.Fix = fixNoNVML
	default:
		c.Status = OK
		c.Summary = "no GPU for the NVIDIA driver on the PCI bus (a node without one needs no NVML)"
	}
	return c
}

func triedRoots(d backend.Driver) []string {
	var out []string
	for _, t := range d.Tried {
		out = append(out, "tried "+t)
	}
	return out
}

// driverRoot: the root the driver was found in, its layout and its
// programs; a program missing costs MPS claims, GPU shares and
// time-slicing.
func (r *run) driverRoot(context.Context) Check {
	c := Check{ID: "driver-root"}
	if r.gpu == nil && !r.pendingNVML() {
		c.Status, c.Summary = Skip, noDriverNeeded
		return c
	}
	d := r.in.Node.Driver()
	c.Summary = d.String()
	c.Details = triedRoots(d)
	if len(d.Missing) == 0 {
		c.Status = OK
		return c
	}
	c.Status = Warn
	c.Summary += ": MPS claims, GPU shares and time-sliced claims fail without " + strings.Join(d.Missing, " and ")
	c.Fix = "give the root that holds the driver's programs too with --nvidia-driver-root (chart: nvidiaDriverRoot), or install them there (the driver's utilities package)"
	return c
}

// moduleVersionFile is where the loaded NVIDIA kernel module says its
// version, under the node's proc.
const moduleVersionFile = "driver/nvidia/version"

var (
	// moduleVersion is the version on the NVRM line: "NVRM version:
	// NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar ..." or "NVRM
	// version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15
	// Release Build ...".
	moduleVersion = regexp.MustCompile(`(?m)^NVRM version:.*?\s([0-9]+\.[0-9]+(?:\.[0-9]+)?)\s`)
	// driverLibrary is a library of the driver named with its version.
	driverLibrary = regexp.MustCompile(`^(libnvidia-ml|libcuda)\.so\.([0-9]+\.[0-9]+(?:\.[0-9]+)?)$`)
)

// driverVersion: the kernel module's version against the driver root's
// libraries (libnvidia-ml.so.1's target, libcuda.so.<version>) and what
// NVML reports: a mismatch (a driver upgraded without a reboot, a root of
// another driver, a partial installation) blocks NVML or CUDA.
func (r *run) driverVersion(context.Context) Check {
	c := Check{ID: "driver-version"}
	if r.gpu == nil && !r.pendingNVML() {
		c.Status, c.Summary = Skip, noDriverNeeded
		return c
	}
	file := filepath.Join(r.in.Node.ProcRoot, moduleVersionFile)
	raw, err := os.ReadFile(file)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && r.pendingNVML() {
			c.Status = Blocker
			c.Summary = "the NVIDIA kernel module is not loaded (no " + file + ")"
			c.Fix = fixNoNVML
			return c
		}
		c.Status, c.Summary = Warn, "cannot tell the kernel module's version: "+err.Error()
		c.Fix = "run on the node itself, or with its /proc"
		return c
	}
	m := moduleVersion.FindSubmatch(raw)
	if m == nil {
		c.Status, c.Summary = Warn, fmt.Sprintf("cannot tell the kernel module's version from %s: %q", file, firstLine(raw))
		c.Fix = "compare it by hand with the versions of libnvidia-ml.so and libcuda.so under the driver root (they must be the same)"
		return c
	}
	module := string(m[1])
	d := r.in.Node.Driver()
	libs := map[string][]string{} // library -> versions under the root
	for _, dir := range d.LibDirs {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if v := driverLibrary.FindStringSubmatch(e.Name()); v != nil && !slices.Contains(libs[v[1]], v[2]) {
				libs[v[1]] = append(libs[v[1]], v[2])
			}
		}
	}
	var problems []string
	if d.NVML != "" {
		if target, err := filepath.EvalSymlinks(d.NVML); err == nil {
			if v := driverLibrary.FindStringSubmatch(filepath.Base(target)); v != nil && v[2] != module {
				problems = append(problems, fmt.Sprintf("%s is %s's (%s): NVML refuses a kernel module of another version (Driver/library version mismatch)", d.NVML, v[2], filepath.Base(target)))
			}
		}
	}
	for _, lib := range []string{"libnvidia-ml", "libcuda"} {
		if !slices.Contains(libs[lib], module) {
			have := "none"
			if len(libs[lib]) > 0 {
				have = "only " + strings.Join(libs[lib], ", ")
			}
			problems = append(problems, fmt.Sprintf("no %s.so.%s in the root's library folders (%s)", lib, module, have))
		}
	}
	if len(r.gpus) > 0 && r.gpus[0].DriverVersion != module {
		problems = append(problems, fmt.Sprintf("NVML reports driver %s", r.gpus[0].DriverVersion))
	}
	c.Details = append(c.Details, "kernel module: "+firstLine(raw))
	for _, lib := range []string{"libnvidia-ml", "libcuda"} {
		for _, v := range libs[lib] {
			if v != module {
				c.Details = append(c.Details, fmt.Sprintf("also %s.so.%s under the root (another driver's: unused)", lib, v))
			}
		}
	}
	if len(problems) == 0 {
		c.Status = OK
		c.Summary = fmt.Sprintf("kernel module %s, libraries of %s under %s", module, module, d.Root.Path)
		return c
	}
	c.Status = Blocker
	c.Summary = fmt.Sprintf("the kernel module is %s, the driver root %s does not match: %s", module, d.Root.Path, strings.Join(problems, "; "))
	c.Fix = "the kernel module and the root's libraries must be of one driver version: after a driver upgrade, reboot (or reload the module) so that the new module runs; for a root of another driver, give the running driver's with --nvidia-driver-root (chart: nvidiaDriverRoot); a partial installation, install the driver again"
	return c
}

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(line)
}

// driverFiles: where GPU containers get the driver's files from (the
// agent's own code decides: driverlibs), how many, libcuda among them;
// none (generation failed) blocks CUDA in every container.
func (r *run) driverFiles(ctx context.Context) Check {
	c := Check{ID: "driver-files"}
	if r.skipWithoutNVML(&c) {
		return c
	}
	o := r.in.Node.DriverFiles(r.in.Paths.CDIDir, r.hook())
	d := driverlibs.New(o).Decide(ctx)
	c.Details = append(c.Details, "toolkit spec folders: "+strings.Join(o.SpecDirs, ", "))
	for _, u := range d.Unreadable {
		c.Details = append(c.Details, "unreadable CDI spec, passed over: "+u)
	}
	status, fix := OK, ""
	if len(d.Unreadable) > 0 {
		status, fix = Warn, "repair or remove the unreadable spec files (the runtime reads them too)"
	}
	switch d.Source {
	case driverlibs.SourceToolkit:
		r.filesFromToolkit = true
		c.Summary = fmt.Sprintf("from the NVIDIA Container Toolkit's spec %s (driver %s)", d.Toolkit, or(d.ToolkitVersion, "of no named version"))
	case driverlibs.SourceGenerated:
		c.Summary = fmt.Sprintf("generated from the driver root %s for driver %s", o.NodeRoot, d.DriverVersion)
		if d.Stale {
			c.Summary += fmt.Sprintf("; the toolkit's spec %s is stale (driver %s), passed over", d.Toolkit, d.ToolkitVersion)
			status = Warn
			fix = join(fix, "refresh the toolkit's spec (nvidia-ctk cdi generate --output="+d.Toolkit+"; the toolkit's nvidia-cdi-refresh does it on driver upgrades) or remove it: the runtime may give it to other containers")
		}
	default:
		c.Status = Blocker
		switch {
		case d.Err != nil:
			c.Summary = fmt.Sprintf("containers get no CUDA: the driver's files could not be generated from %s for driver %s: %v", o.NodeRoot, d.DriverVersion, d.Err)
		case d.DriverVersion == "":
			c.Summary = "containers get no CUDA: NVML does not tell the driver version"
		default:
			c.Summary = "containers get no CUDA: no driver files found"
		}
		if d.Stale {
			c.Details = append(c.Details, fmt.Sprintf("the toolkit's spec %s is stale (driver %s), passed over", d.Toolkit, d.ToolkitVersion))
		}
		c.Fix = "install the libraries of the running driver version under the driver root (or give the root that has them with --nvidia-driver-root), or the NVIDIA Container Toolkit's spec (nvidia-ctk cdi generate)"
		return c
	}
	mounts, libcuda := 0, false
	if d.Edits != nil {
		mounts = len(d.Edits.Mounts)
		for _, m := range d.Edits.Mounts {
			libcuda = libcuda || strings.HasPrefix(filepath.Base(m.HostPath), "libcuda.so.")
		}
	}
	c.Summary += fmt.Sprintf(": %s", plural(mounts, "mount", "mounts"))
	if !libcuda {
		c.Status = Blocker
		c.Summary += ", no libcuda among them: containers get no CUDA"
		c.Fix = join(fix, "regenerate the toolkit's spec (nvidia-ctk cdi generate) or remove it: the agent then generates the files")
		return c
	}
	c.Summary += ", libcuda among them"
	c.Status, c.Fix = status, fix
	return c
}

// hook is the nvidia-cdi-hook the agent would name: the one given, the
// one shipped beside this program, or the one an agent installed into its
// state directory; "" where there is none.
func (r *run) hook() string {
	if r.in.CDIHook != "" {
		return r.in.CDIHook
	}
	if h := driverlibs.ShippedHook(); h != "" {
		return h
	}
	if installed := filepath.Join(r.in.Paths.StateDir, "bin", driverlibs.HookProgram); isFile(installed) {
		return installed
	}
	return ""
}

// cdiHook: the generated driver files' hooks need nvidia-cdi-hook on the
// node; without it containers get the libraries but no soname links nor
// ld cache entry.
func (r *run) cdiHook(context.Context) Check {
	c := Check{ID: "nvidia-cdi-hook"}
	if r.skipWithoutNVML(&c) {
		return c
	}
	h := r.hook()
	switch {
	case r.in.CDIHook != "" && !isFile(h):
		c.Status, c.Summary = Warn, "--nvidia-cdi-hook "+h+": no such file"
	case h == r.in.CDIHook && h != "":
		c.Status, c.Summary = OK, "given: "+h
	case h == driverlibs.ShippedHook() && h != "":
		c.Status, c.Summary = OK, "ships beside hwdra: "+h+" (the agent installs it into --state-dir/bin)"
	case h != "":
		c.Status, c.Summary = OK, "installed by the agent: "+h
	case r.filesFromToolkit:
		c.Status, c.Summary = OK, "none here, and none needed: the toolkit's spec names its own hooks"
	default:
		c.Status, c.Summary = Warn, "no nvidia-cdi-hook: the generated driver files get no soname links and no ld cache entry, so programs that load libcuda.so.1 do not find it"
	}
	if c.Status == Warn {
		c.Fix = "run the agent's image, which ships the hook and installs it into --state-dir/bin, or give an installed NVIDIA Container Toolkit's with --nvidia-cdi-hook"
	}
	return c
}

func isFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

func or(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// join joins two fixes.
func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
