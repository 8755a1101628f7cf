package gpu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Driver libraries.
//
// A container needs the NVIDIA user-space driver (libcuda, libnvidia-ml,
// ...) of exactly the host's driver version, plus its ldcache and symlink
// hooks. NVIDIA's nvcdi library could generate those edits, but it loads
// the real libnvidia-ml and walks the real driver installation, so it
// cannot run on the mock, and it would pull nvidia-container-toolkit into
// the agent. Instead prepare refers to the node-wide spec that the
// toolkit already maintains, `nvidia-ctk cdi generate` (kind
// nvidia.com/gpu, usually /etc/cdi/nvidia.yaml or /var/run/cdi/nvidia.yaml,
// which the toolkit's nvidia-cdi-refresh service rewrites on driver
// upgrades): its spec-level containerEdits (library mounts, hooks,
// environment, control device nodes) are merged into each full-GPU and
// MIG device's edits. When several spec directories hold one, the last
// directory wins, as in a CDI cache. Without such a spec prepare still
// works, logging once that containers will lack the driver libraries.
//
// The spec files are re-read only when they change (modification time or
// size), so a prepare costs a directory listing.

type driverLibs struct {
	dirs []string

	mu      sync.Mutex
	files   map[string]specFile
	present *bool // nil until the first look
}

type specFile struct {
	mod  time.Time
	size int64
	spec *cdi.Spec // nil when unreadable
}

func newDriverLibs(dirs []string) *driverLibs {
	return &driverLibs{dirs: dirs, files: map[string]specFile{}}
}

const (
	driverSpecVendor = "nvidia.com"
	driverSpecClass  = "gpu"
)

// edits returns the node-wide NVIDIA spec's container edits, nil when
// there is none.
func (l *driverLibs) edits(ctx context.Context) *cdispec.ContainerEdits {
	logger := klog.FromContext(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	var best *cdi.Spec
	seen := map[string]bool{}
	for prio, dir := range l.dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue // a missing directory holds no spec
		}
		for _, e := range entries {
			name := e.Name()
			ext := filepath.Ext(name)
			// Claim specs (this agent's and other drivers') are never it.
			if e.IsDir() || ext != ".json" && ext != ".yaml" || strings.Contains(name, "_claim_") {
				continue
			}
			info, err := e.Info()
			if err != nil {
				continue
			}
			path := filepath.Join(dir, name)
			seen[path] = true
			f, ok := l.files[path]
			if !ok || !f.mod.Equal(info.ModTime()) || f.size != info.Size() {
				f = specFile{mod: info.ModTime(), size: info.Size()}
				if f.spec, err = cdi.ReadSpec(path, prio); err != nil {
					logger.Error(err, "Unreadable CDI spec, ignored when looking for the NVIDIA driver spec", "file", path)
				}
				l.files[path] = f
			}
			if s := f.spec; s != nil && s.GetVendor() == driverSpecVendor && s.GetClass() == driverSpecClass {
				best = s // later directories (and files) win
			}
		}
	}
	for path := range l.files {
		if !seen[path] {
			delete(l.files, path)
		}
	}
	found := best != nil
	if l.present == nil || *l.present != found {
		if found {
			logger.Info("Containers get the NVIDIA driver libraries of the node-wide CDI spec", "file", best.GetPath())
		} else {
			logger.Info("No node-wide NVIDIA CDI spec (kind nvidia.com/gpu): containers get GPU device nodes but no driver libraries; generate one with `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml`",
				"dirs", l.dirs)
		}
		l.present = &found
	}
	if !found {
		return nil
	}
	e := best.ContainerEdits
	return &e
}
