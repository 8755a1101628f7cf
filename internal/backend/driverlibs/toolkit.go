// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package driverlibs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// The NVIDIA Container Toolkit's node-wide spec, `nvidia-ctk cdi
// generate` (kind nvidia.com/gpu, usually /etc/cdi/nvidia.yaml or
// /var/run/cdi/nvidia.yaml, rewritten by the toolkit's nvidia-cdi-refresh
// service on driver upgrades): its spec-level containerEdits are the
// driver's files. When several spec directories hold one, the last
// directory wins, as in a CDI cache. The files are re-read only when they
// change (modification time or size), so a look costs a directory
// listing.
const (
	toolkitVendor = "nvidia.com"
	toolkitClass  = "gpu"
)

// SpecDirs are where the toolkit's spec is looked for: the node's (nil:
// none known, the defaults /etc/cdi and /var/run/cdi) and the runtime's,
// the agent's --cdi-dir, last (it wins).
func SpecDirs(node []string, cdiDir string) []string {
	if node == nil {
		node = []string{"/etc/cdi", "/var/run/cdi"}
	}
	if cdiDir == "" || slices.Contains(node, cdiDir) {
		return node
	}
	return append(slices.Clone(node), cdiDir)
}

// toolkitSpecs finds the toolkit's spec in its directories.
type toolkitSpecs struct {
	dirs  []string
	files map[string]specFile
}

type specFile struct {
	mod  time.Time
	size int64
	spec *cdi.Spec // nil when unreadable
	err  error     // why unreadable
}

// find returns the toolkit's spec, nil when there is none, and the spec
// files that could not be read ("file: why"). An unreadable spec file is
// logged when it is read, and passed over.
func (t *toolkitSpecs) find(logger klog.Logger) (*cdi.Spec, []string) {
	if t.files == nil {
		t.files = map[string]specFile{}
	}
	var best *cdi.Spec
	seen := map[string]bool{}
	for prio, dir := range t.dirs {
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
			f, ok := t.files[path]
			if !ok || !f.mod.Equal(info.ModTime()) || f.size != info.Size() {
				f = specFile{mod: info.ModTime(), size: info.Size()}
				if f.spec, f.err = cdi.ReadSpec(path, prio); f.err != nil {
					logger.Error(f.err, "Unreadable CDI spec, passed over when looking for the NVIDIA Container Toolkit's spec", "file", path)
				}
				t.files[path] = f
			}
			if s := f.spec; s != nil && s.GetVendor() == toolkitVendor && s.GetClass() == toolkitClass {
				best = s // later directories (and files) win
			}
		}
	}
	var unreadable []string
	for path, f := range t.files {
		switch {
		case !seen[path]:
			delete(t.files, path)
		case f.err != nil:
			unreadable = append(unreadable, path+": "+f.err.Error())
		}
	}
	slices.Sort(unreadable)
	return best, unreadable
}

// versionedLib matches the driver's own libraries in a spec's mounts,
// named with the driver's version: libcuda.so.580.159.04.
var versionedLib = regexp.MustCompile(`/lib(cuda|nvidia-ml)\.so\.([0-9]+\.[0-9]+(\.[0-9]+)?)$`)

// specVersion is the driver version whose libraries a spec mounts, ""
// where it mounts none named with a version.
func specVersion(s *cdi.Spec) string {
	for _, m := range s.ContainerEdits.Mounts {
		if v := versionedLib.FindStringSubmatch(m.HostPath); v != nil {
			return v[2]
		}
	}
	return ""
}
