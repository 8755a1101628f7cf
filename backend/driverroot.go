package backend

import (
	"os"
	"path/filepath"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hwdra/hwdra/nvml"
)

// DriverRoot is where the NVIDIA user-space driver is installed on the
// node: "/" for a driver installed on the host, /run/nvidia/driver where
// the GPU operator's driver container runs it.
type DriverRoot struct {
	// Path is the root on the node. Device nodes found under it are
	// named by it in CDI specs, which the container runtime reads on the
	// node.
	Path string
	// Mount is where this process sees Path: the same outside a container
	// (empty means Path), /driver-root in the DaemonSet.
	Mount string
}

const nvmlSoname = "libnvidia-ml.so.1"

// driverLibDirs are where distributions and the driver container put
// libnvidia-ml, relative to the driver root.
var driverLibDirs = []string{
	"usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib/aarch64-linux-gnu",
	"lib/x86_64-linux-gnu", "lib64", "lib/aarch64-linux-gnu", "usr/lib", "lib",
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

// nvmlLibrary is the libnvidia-ml.so.1 to load: "" (the dynamic loader's
// search) when this process's own root is the driver's, else the first
// found under the root. Not found yet (a driver container still
// starting), the first candidate: Init fails and is retried.
func (r DriverRoot) nvmlLibrary() string {
	m := r.mount()
	if m == "/" {
		return ""
	}
	for _, d := range driverLibDirs {
		p := filepath.Join(m, d, nvmlSoname)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return filepath.Join(m, driverLibDirs[0], nvmlSoname)
}

// newNVML is an NVML backend on the driver root's library.
func (r DriverRoot) newNVML(sysfs string) *nvml.Backend {
	var opts []gonvml.LibraryOption
	if lib := r.nvmlLibrary(); lib != "" {
		opts = append(opts, gonvml.WithLibraryPath(lib))
	}
	return nvml.New(gonvml.New(opts...), nvml.WithSysfs(sysfs))
}

// devRoot is where this process finds the GPUs' device nodes and how the
// node names that directory: the driver root's dev/ where it has the
// driver's control node (a driver container's root), else the node's /dev.
func (r DriverRoot) devRoot() (local, node string) {
	if m := r.mount(); m != "/" {
		if _, err := os.Stat(filepath.Join(m, "dev", "nvidiactl")); err == nil {
			return filepath.Join(m, "dev"), filepath.Join(r.path(), "dev")
		}
	}
	return "/dev", "/dev"
}

// programs are the driver's programs as this process runs them: the
// root's usr/bin, with the root's library directories that exist where
// the root is not this process's own.
func (r DriverRoot) programs() nvml.Programs {
	m := r.mount()
	p := nvml.Programs{Bin: filepath.Join(m, "usr", "bin")}
	if m == "/" {
		return p
	}
	for _, d := range driverLibDirs {
		if dir := filepath.Join(m, d); dirExists(dir) {
			p.LibraryPath = append(p.LibraryPath, dir)
		}
	}
	return p
}

func dirExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// specDirs are searched for the NVIDIA Container Toolkit's node-wide CDI
// spec: the driver root's /etc/cdi and the runtime's /var/run/cdi.
func (r DriverRoot) specDirs() []string {
	return []string{filepath.Join(r.mount(), "etc", "cdi"), "/var/run/cdi"}
}

// driverRootPath is where NVML is looked for, for messages.
func (n *Node) driverRootPath() string {
	if n.driverRoot == nil {
		return "mock"
	}
	if lib := n.driverRoot.nvmlLibrary(); lib != "" {
		return lib
	}
	return n.driverRoot.path() + " (the loader's search path)"
}
