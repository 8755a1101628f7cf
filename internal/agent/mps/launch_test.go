// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package mps

import (
	"os"
	"path/filepath"
	"testing"
)

// The cgroup beside a pod's, found from the node's mounts: cgroup v1
// (one mount per hierarchy, combined controllers, a named one) and v2.
func TestBesidePod(t *testing.T) {
	mountinfo := filepath.Join(t.TempDir(), "mountinfo")
	if err := os.WriteFile(mountinfo, []byte(`22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw
30 22 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
31 22 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
32 22 0:28 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,xattr,name=systemd
33 22 0:29 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
`), 0o644); err != nil {
		t.Fatal(err)
	}
	mounts, err := cgroupMounts(mountinfo, "/proc/1/root")
	if err != nil {
		t.Fatal(err)
	}
	for key, dir := range map[string]string{"memory": "/proc/1/root/sys/fs/cgroup/memory", "cpu,cpuacct": "/proc/1/root/sys/fs/cgroup/cpu,cpuacct",
		"name=systemd": "/proc/1/root/sys/fs/cgroup/systemd", "": "/proc/1/root/sys/fs/cgroup/unified"} {
		if mounts[key].dir != dir {
			t.Errorf("hierarchy %q mounted at %q, want %q", key, mounts[key].dir, dir)
		}
	}
	for _, tc := range []struct {
		path, want string
		ok         bool
	}{
		{"/kubepods/besteffort/pod1234/abcd", "/proc/1/root/sys/fs/cgroup/memory/kubepods/besteffort/hwdra-mps-x", true},
		{"/kubepods/pod1234/abcd", "/proc/1/root/sys/fs/cgroup/memory/kubepods/hwdra-mps-x", true},
		{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice/cri-containerd-ab.scope",
			"/proc/1/root/sys/fs/cgroup/memory/kubepods.slice/kubepods-burstable.slice/hwdra-mps-x", true},
		{"/user.slice", "", false},
		{"/", "", false},
	} {
		got, ok := besidePod(tc.path, mounts["memory"], "hwdra-mps-x")
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: %q %v, want %q %v", tc.path, got, ok, tc.want, tc.ok)
		}
	}
	// A mount of a subtree places paths under it.
	sub := cgroupMount{dir: "/c", root: "/kubepods/besteffort"}
	if got, ok := besidePod("/kubepods/besteffort/pod1/ctr", sub, "hwdra-mps-x"); got != "/c/hwdra-mps-x" || !ok {
		t.Errorf("beside a pod in a mounted subtree: %q %v", got, ok)
	}
	if got, ok := besidePod("/elsewhere/a/b/c", sub, "hwdra-mps-x"); ok {
		t.Errorf("a path outside the mount: %q", got)
	}
}
