// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package backend

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/mock/profile"
)

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o755); err != nil {
		t.Fatal(err)
	}
}

// install lays out a driver under dir as real nodes do: FHS (usr/bin,
// usr/lib/x86_64-linux-gnu) or flat (bin, lib64), with NVML and, unless
// noPrograms, the programs the agent runs.
func install(t *testing.T, dir string, flat, noPrograms bool) {
	t.Helper()
	bin, lib := "usr/bin", "usr/lib/x86_64-linux-gnu"
	if flat {
		bin, lib = "bin", "lib64"
	}
	touch(t, filepath.Join(dir, lib, nvmlSoname))
	if !noPrograms {
		for _, p := range DriverPrograms {
			touch(t, filepath.Join(dir, bin, p))
		}
	}
}

// TestDriverRoot: where the agent loads NVML from and finds the GPUs'
// device nodes, for a driver on the host and in a driver container, seen
// from the host and from the DaemonSet's mount.
func TestDriverRoot(t *testing.T) {
	container := t.TempDir() // a driver container's root: libs and dev/
	touch(t, filepath.Join(container, "usr/lib64", nvmlSoname))
	touch(t, filepath.Join(container, "dev", "nvidiactl"))
	hostOnly := t.TempDir() // a root without dev/nvidiactl
	touch(t, filepath.Join(hostOnly, "usr/lib/x86_64-linux-gnu", nvmlSoname))
	empty := t.TempDir()

	for _, tc := range []struct {
		name                   string
		root                   DriverRoot
		lib, devLocal, devNode string
		specDir                string
	}{
		{"host driver, agent on the host", DriverRoot{Path: "/"}, "", "/dev", "/dev", "/etc/cdi"},
		{"driver container, agent in the DaemonSet", DriverRoot{Path: "/run/nvidia/driver", Mount: container},
			filepath.Join(container, "usr/lib64", nvmlSoname), filepath.Join(container, "dev"), "/run/nvidia/driver/dev", filepath.Join(container, "etc/cdi")},
		{"host driver, agent in the DaemonSet", DriverRoot{Path: "/", Mount: hostOnly},
			filepath.Join(hostOnly, "usr/lib/x86_64-linux-gnu", nvmlSoname), "/dev", "/dev", filepath.Join(hostOnly, "etc/cdi")},
		{"driver container not ready yet", DriverRoot{Path: empty},
			filepath.Join(empty, driverLibDirs[0].dir, nvmlSoname), "/dev", "/dev", filepath.Join(empty, "etc/cdi")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.root.Find()
			if got := d.nvmlLibrary(); got != tc.lib {
				t.Errorf("library %q, want %q", got, tc.lib)
			}
			local, node := d.devRoot()
			if local != tc.devLocal || node != tc.devNode {
				t.Errorf("dev root %q (node %q), want %q (%q)", local, node, tc.devLocal, tc.devNode)
			}
			if dirs := d.specDirs(); !slices.Contains(dirs, tc.specDir) || !slices.Contains(dirs, "/var/run/cdi") {
				t.Errorf("spec dirs %v, want %s and /var/run/cdi", dirs, tc.specDir)
			}
		})
	}
}

// TestDriverLayouts: under each root real nodes use, NVML, the library
// folders and the programs are found where that layout keeps them, and
// the programs run with the root's libraries.
func TestDriverLayouts(t *testing.T) {
	for _, tc := range []struct {
		root         string
		flat         bool
		layout       Layout
		lib, bin     string
		libraryPaths []string
	}{
		{"/", false, LayoutFHS, "usr/lib/x86_64-linux-gnu", "usr/bin", []string{"usr/lib/x86_64-linux-gnu", "usr/lib"}},
		{"/run/nvidia/driver", false, LayoutFHS, "usr/lib/x86_64-linux-gnu", "usr/bin", []string{"usr/lib/x86_64-linux-gnu", "usr/lib"}},
		{"/usr/local/nvidia", true, LayoutFlat, "lib64", "bin", []string{"lib64"}},
		{"/home/kubernetes/bin/nvidia", true, LayoutFlat, "lib64", "bin", []string{"lib64"}},
	} {
		t.Run(tc.root, func(t *testing.T) {
			mount := t.TempDir()
			install(t, mount, tc.flat, false)
			d := DriverRoot{Path: tc.root, Mount: mount}.Find()
			if d.Layout != tc.layout || d.NVML != filepath.Join(mount, tc.lib, nvmlSoname) || d.Bin != filepath.Join(mount, tc.bin) || len(d.Missing) != 0 {
				t.Errorf("found %+v", d)
			}
			p := d.programs()
			var want []string
			for _, l := range tc.libraryPaths {
				want = append(want, filepath.Join(mount, l))
			}
			if p.Bin != d.Bin || !slices.Equal(p.LibraryPath, want) {
				t.Errorf("programs %+v, want bin %s with libraries %v", p, d.Bin, want)
			}
			if s := d.String(); !strings.Contains(s, tc.root) || !strings.Contains(s, string(tc.layout)) {
				t.Errorf("String() = %q", s)
			}
		})
	}
}

// TestFindDriverRoot: without a given root the known roots are tried in
// order, one with NVML and programs before one with NVML alone; where
// none has a driver, the host's root is kept and every root tried is
// named.
func TestFindDriverRoot(t *testing.T) {
	for _, tc := range []struct {
		name      string
		installed map[string]bool // root -> flat; present roots have NVML
		partial   []string        // roots without programs
		want      string
		missing   bool
	}{
		{"the GPU operator's container first", map[string]bool{"/run/nvidia/driver": false, "/": false}, nil, "/run/nvidia/driver", false},
		{"the host", map[string]bool{"/": false, "/usr/local/nvidia": true}, nil, "/", false},
		{"a CUDA image's layout", map[string]bool{"/usr/local/nvidia": true}, nil, "/usr/local/nvidia", false},
		{"GKE", map[string]bool{"/home/kubernetes/bin/nvidia": true}, nil, "/home/kubernetes/bin/nvidia", false},
		// The measured VM: ldconfig finds NVML under / too, the programs
		// are only in /usr/local/nvidia/bin.
		{"programs decide", map[string]bool{"/": false, "/usr/local/nvidia": true}, []string{"/"}, "/usr/local/nvidia", false},
		{"NVML alone", map[string]bool{"/usr/local/nvidia": true}, []string{"/usr/local/nvidia"}, "/usr/local/nvidia", true},
		{"no driver", nil, nil, "/", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := t.TempDir()
			for root, flat := range tc.installed {
				install(t, filepath.Join(host, root), flat, slices.Contains(tc.partial, root))
			}
			d := DriverRoot{Host: host}.Find()
			if d.Root.Path != tc.want || d.Root.Mount != filepath.Join(host, tc.want) {
				t.Fatalf("found %s (mount %s), want %s: %s", d.Root.Path, d.Root.Mount, tc.want, d)
			}
			if (len(d.Missing) > 0) != tc.missing {
				t.Errorf("missing %v, want some: %v", d.Missing, tc.missing)
			}
			if tc.installed == nil {
				s := d.String()
				for _, r := range KnownRoots {
					if !strings.Contains(s, r+": no "+nvmlSoname) {
						t.Errorf("%q does not name %s", s, r)
					}
				}
			}
		})
	}
}

// TestMockDriverLayouts: the mock lays out its driver as each real root
// does, and a mock node finds it with the host's search: programs and
// libraries where that layout keeps them.
func TestMockDriverLayouts(t *testing.T) {
	for root, layout := range profile.DriverRoots {
		t.Run(root, func(t *testing.T) {
			n, err := Open("mock:" + writeProfile(t, "gpus: [{model: h100-80gb, count: 1}]\ndriver: {root: "+root+"}\n"))
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			d, m := n.Driver(), n.Mock()
			if d.Root.Path != root || d.Bin != m.DriverBin() || d.Bin != filepath.Join(m.DriverRoot(), layout.Bin) || len(d.Missing) > 0 {
				t.Errorf("found %s (bin %s, missing %v), want %s with programs in %s", d, d.Bin, d.Missing, root, m.DriverBin())
			}
			if d.NVML != filepath.Join(m.DriverRoot(), layout.Lib, nvmlSoname) {
				t.Errorf("NVML %s, want it in %s", d.NVML, layout.Lib)
			}
			if n.Programs.Bin != d.Bin {
				t.Errorf("programs from %s, want %s", n.Programs.Bin, d.Bin)
			}
		})
	}
	t.Run("no programs", func(t *testing.T) {
		n, err := Open("mock:" + writeProfile(t, "gpus: [{model: h100-80gb, count: 1}]\ndriver: {root: /usr/local/nvidia, noPrograms: true}\n"))
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		if d := n.Driver(); d.Bin != "" || !slices.Equal(d.Missing, DriverPrograms) || !strings.Contains(d.String(), "none of the driver's programs") {
			t.Errorf("found %s (missing %v)", d, d.Missing)
		}
	})
}

// TestOpenHostWithoutDriver: a driver root without NVML opens (NICs
// only), and NVML's absence is no error; no NVML call follows the failed
// Init.
func TestOpenHostWithoutDriver(t *testing.T) {
	root := t.TempDir()
	touch(t, filepath.Join(root, "usr/lib64", nvmlSoname)) // not a library
	n, err := OpenWith(Host, Options{DriverRoot: DriverRoot{Path: root}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.GPU() != nil {
		t.Fatal("NVML came up from an empty file")
	}
}
