package backend

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
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
		{"default", DriverRoot{}, "", "/dev", "/dev", "/etc/cdi"},
		{"driver container, agent in the DaemonSet", DriverRoot{Path: "/run/nvidia/driver", Mount: container},
			filepath.Join(container, "usr/lib64", nvmlSoname), filepath.Join(container, "dev"), "/run/nvidia/driver/dev", filepath.Join(container, "etc/cdi")},
		{"host driver, agent in the DaemonSet", DriverRoot{Path: "/", Mount: hostOnly},
			filepath.Join(hostOnly, "usr/lib/x86_64-linux-gnu", nvmlSoname), "/dev", "/dev", filepath.Join(hostOnly, "etc/cdi")},
		{"driver container not ready yet", DriverRoot{Path: empty},
			filepath.Join(empty, driverLibDirs[0], nvmlSoname), "/dev", "/dev", filepath.Join(empty, "etc/cdi")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.root.nvmlLibrary(); got != tc.lib {
				t.Errorf("library %q, want %q", got, tc.lib)
			}
			local, node := tc.root.devRoot()
			if local != tc.devLocal || node != tc.devNode {
				t.Errorf("dev root %q (node %q), want %q (%q)", local, node, tc.devLocal, tc.devNode)
			}
			if dirs := tc.root.specDirs(); !slices.Contains(dirs, tc.specDir) || !slices.Contains(dirs, "/var/run/cdi") {
				t.Errorf("spec dirs %v, want %s and /var/run/cdi", dirs, tc.specDir)
			}
		})
	}
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
