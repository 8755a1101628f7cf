// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package backend

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/internal/backend/nvml"
)

// DriverRoot is where the NVIDIA user-space driver is installed on the
// node. Real nodes use two layouts:
//
//   - the file system's own (FHS): programs in usr/bin, libraries in
//     usr/lib/<triplet>, usr/lib64 or lib...: a driver installed on the host
//     ("/") and the GPU operator's driver container (/run/nvidia/driver);
//   - flat: programs in bin, libraries in lib64 (or lib): NVIDIA's CUDA
//     images and nodes that copy their driver so (/usr/local/nvidia; GKE's
//     /home/kubernetes/bin/nvidia).
//
// An empty Path finds the root: the known roots are tried in the order of
// KnownRoots, under Host.
type DriverRoot struct {
	// Path is the root on the node; empty: found (KnownRoots). Device
	// nodes found under it are named by it in CDI specs, which the
	// container runtime reads on the node.
	Path string
	// Mount is where this process sees Path: the same outside a container
	// (empty means Path), /driver-root in the DaemonSet.
	Mount string
	// Host is where this process sees the node's "/" (the DaemonSet
	// mounts only the known roots under /host, and for "/" only the
	// folders a driver installed on the node uses); empty: "/". The
	// known roots are looked for under it when Path is empty.
	Host string
}

// KnownRoots are where drivers are installed, in the order they are tried
// when no root is given: the GPU operator's driver container first (where
// it runs, its driver is the one loaded), then the host's own
// installation, then the flat layouts of CUDA images and of GKE. A root
// with both NVML and the driver's programs is taken before one with NVML
// alone (a VM image whose NVML the loader also finds under / while the
// programs live in /usr/local/nvidia/bin).
var KnownRoots = []string{"/run/nvidia/driver", "/", "/usr/local/nvidia", "/home/kubernetes/bin/nvidia"}

// Layout names a driver installation's shape.
type Layout string

const (
	// LayoutFHS: programs in usr/bin, libraries in usr/lib/<triplet> and
	// the like (the host, the GPU operator's driver container).
	LayoutFHS Layout = "fhs"
	// LayoutFlat: programs in bin, libraries in lib64 or lib
	// (/usr/local/nvidia, GKE's /home/kubernetes/bin/nvidia).
	LayoutFlat Layout = "flat"
)

const nvmlSoname = "libnvidia-ml.so.1"

// The places of libraries and programs under a root, in the order they are
// looked at. Each belongs to a layout; a root is of the layout of the
// place its NVML (else its programs) was found in.
var (
	driverLibDirs = []place{
		{"usr/lib/x86_64-linux-gnu", LayoutFHS}, {"usr/lib64", LayoutFHS}, {"usr/lib/aarch64-linux-gnu", LayoutFHS},
		{"lib/x86_64-linux-gnu", LayoutFHS}, {"lib64", LayoutFlat}, {"lib/aarch64-linux-gnu", LayoutFHS},
		{"usr/lib", LayoutFHS}, {"lib", LayoutFlat},
	}
	driverBinDirs = []place{{"usr/bin", LayoutFHS}, {"bin", LayoutFlat}}
)

type place struct {
	dir    string
	layout Layout
}

// DriverPrograms are the programs of the driver the agent runs (MPS,
// time slices) and looks for.
var DriverPrograms = []string{"nvidia-smi", "nvidia-cuda-mps-control"}

// Driver is a driver installation as found under its root.
type Driver struct {
	// Root is the root, resolved: Path is the node's path, Mount where
	// this process sees it.
	Root DriverRoot
	// Layout is its shape; "" where nothing of a driver was found.
	Layout Layout
	// NVML is libnvidia-ml.so.1 as this process sees it; "" where none
	// was found.
	NVML string
	// LibDirs are the root's library directories that exist, as this
	// process sees them.
	LibDirs []string
	// Bin is the directory of its programs as this process sees it; ""
	// where none of DriverPrograms was found.
	Bin string
	// Missing are the DriverPrograms Bin lacks.
	Missing []string
	// Tried says where the root was looked for when it was found, for
	// messages ("/run/nvidia/driver: no libnvidia-ml.so.1", ...).
	Tried []string
}

func (r DriverRoot) path() string {
	if r.Path == "" {
		return "/"
	}
	return r.Path
}

func (r DriverRoot) mount() string {
	if r.Mount == "" {
		return r.path()
	}
	return r.Mount
}

// Find resolves the root: the given one as it is, or the first known
// root (KnownRoots, under Host) with NVML and the driver's programs, else
// the first with NVML; where none has NVML, the host's ("/": a driver
// may appear later, and NIC-only nodes have none).
func (r DriverRoot) Find() Driver {
	if r.Path != "" {
		return r.inspect()
	}
	host := r.Host
	if host == "" {
		host = "/"
	}
	var (
		tried []string
		first *Driver
	)
	for _, known := range KnownRoots {
		d := DriverRoot{Path: known, Mount: filepath.Join(host, known)}.inspect()
		switch {
		case d.NVML != "" && d.Bin != "":
			d.Tried = tried
			return d
		case d.NVML != "" && first == nil:
			first = &d
			tried = append(tried, known+": NVML without the driver's programs")
		case d.NVML == "":
			tried = append(tried, known+": no "+nvmlSoname)
		}
	}
	if first != nil {
		first.Tried = tried
		return *first
	}
	d := DriverRoot{Path: "/", Mount: host}.inspect()
	d.Tried = tried
	return d
}

// inspect looks at what a given root holds.
func (r DriverRoot) inspect() Driver {
	r.Mount = r.mount()
	r.Path = r.path()
	d := Driver{Root: r}
	m := r.Mount
	for _, p := range driverLibDirs {
		dir := filepath.Join(m, p.dir)
		if !dirExists(dir) {
			continue
		}
		d.LibDirs = append(d.LibDirs, dir)
		if d.NVML == "" && fileExists(filepath.Join(dir, nvmlSoname)) {
			d.NVML, d.Layout = filepath.Join(dir, nvmlSoname), p.layout
		}
	}
	for _, p := range driverBinDirs {
		dir := filepath.Join(m, p.dir)
		var missing []string
		for _, prog := range DriverPrograms {
			if !fileExists(filepath.Join(dir, prog)) {
				missing = append(missing, prog)
			}
		}
		if len(missing) < len(DriverPrograms) {
			d.Bin, d.Missing = dir, missing
			if d.Layout == "" {
				d.Layout = p.layout
			}
			break
		}
	}
	if d.Bin == "" {
		d.Missing = DriverPrograms
	}
	return d
}

// String says where the driver is, for logs and /readyz.
func (d Driver) String() string {
	if d.NVML == "" && d.Bin == "" {
		s := "no NVIDIA driver under " + d.Root.Path
		if len(d.Tried) > 0 {
			s = "no NVIDIA driver in the known roots (" + strings.Join(d.Tried, "; ") + ")"
		}
		return s
	}
	s := fmt.Sprintf("NVIDIA driver root %s (%s layout): NVML %s", d.Root.Path, d.Layout, orNone(d.NVML))
	if d.Bin == "" {
		return s + ", none of the driver's programs (" + strings.Join(DriverPrograms, ", ") + ") in " + d.binDirs()
	}
	s += ", programs in " + d.Bin
	if len(d.Missing) > 0 {
		s += " (missing: " + strings.Join(d.Missing, ", ") + ")"
	}
	return s
}

func (d Driver) binDirs() string {
	var dirs []string
	for _, p := range driverBinDirs {
		dirs = append(dirs, filepath.Join(d.Root.Mount, p.dir))
	}
	return strings.Join(dirs, " or ")
}

func orNone(s string) string {
	if s == "" {
		return "(none: no " + nvmlSoname + ")"
	}
	return s
}

// nvmlLibrary is the libnvidia-ml.so.1 to load: "" (the dynamic loader's
// search) when this process's own root is the driver's, else the one
// found under the root. Not found yet (a driver container still
// starting), the first candidate: Init fails and is retried.
func (d Driver) nvmlLibrary() string {
	if d.Root.Mount == "/" {
		return ""
	}
	if d.NVML != "" {
		return d.NVML
	}
	return filepath.Join(d.Root.Mount, driverLibDirs[0].dir, nvmlSoname)
}

// newNVML is an NVML backend on the driver's library.
func (d Driver) newNVML(sysfs string) *nvml.Backend {
	var opts []gonvml.LibraryOption
	if lib := d.nvmlLibrary(); lib != "" {
		opts = append(opts, gonvml.WithLibraryPath(lib))
	}
	return nvml.New(gonvml.New(opts...), nvml.WithSysfs(sysfs))
}

// devRoot is where this process finds the GPUs' device nodes and how the
// node names that directory: the driver root's dev/ where it has the
// driver's control node (a driver container's root), else the node's /dev.
func (d Driver) devRoot() (local, node string) {
	if m := d.Root.Mount; m != "/" {
		if _, err := os.Stat(filepath.Join(m, "dev", "nvidiactl")); err == nil {
			return filepath.Join(m, "dev"), filepath.Join(d.Root.Path, "dev")
		}
	}
	return "/dev", "/dev"
}

// programs are the driver's programs as this process runs them, with the
// root's library directories where the root is not this process's own.
// Where none was found, Bin names where they were looked for, so that
// running one fails naming the path.
func (d Driver) programs() nvml.Programs {
	p := nvml.Programs{Bin: d.Bin}
	if p.Bin == "" {
		p.Bin = filepath.Join(d.Root.Mount, driverBinDirs[0].dir)
		for _, b := range driverBinDirs {
			if b.layout == d.Layout {
				p.Bin = filepath.Join(d.Root.Mount, b.dir) // where this layout keeps them
				break
			}
		}
	}
	if d.Root.Mount != "/" {
		p.LibraryPath = d.LibDirs
	}
	return p
}

func dirExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

func fileExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir()
}

// specDirs are searched for the NVIDIA Container Toolkit's node-wide CDI
// spec: the driver root's /etc/cdi and the runtime's /var/run/cdi.
func (d Driver) specDirs() []string {
	return []string{filepath.Join(d.Root.Mount, "etc", "cdi"), "/var/run/cdi"}
}
