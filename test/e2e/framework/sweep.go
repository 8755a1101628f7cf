// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fixedPaths are written by the kubelet, libcni or the controller-manager
// outside any directory we can configure (the device-plugin socket folder,
// libcni's result cache, the default flex-volume folder). The sweep removes
// those that did not exist before the run.
var fixedPaths = []string{"/var/lib/kubelet", "/var/lib/cni", "/usr/libexec/kubernetes"}

func snapshotFixedPaths() []string {
	var absent []string
	for _, p := range fixedPaths {
		if _, err := os.Lstat(p); os.IsNotExist(err) {
			absent = append(absent, p)
		}
	}
	return absent
}

type logf func(format string, args ...any)

// sweep removes everything a run may have left behind, whether or not the
// tests cleaned up: processes in the namespace, containers (found through the
// kubepods cgroups, since they live in their pods' own namespaces), mounts
// under the root, its workers' cgroups, the machine's kubepods (where node
// is set: a run with a node in the machine's namespaces), fixed paths and
// the namespace itself.
func sweep(ns, root string, createdFixed []string, node bool, log logf) {
	workers := workerNamespaces(ns)
	for _, n := range append([]string{ns}, workers...) {
		killInNamespace(n, log)
	}
	killByCommandLine(root, log)
	cleanupCgroups(log, func() []string { return runCgroups(ns, node) })
	unmountUnder(root, log)
	if os.Getenv(EnvKeep) == "" {
		if err := os.RemoveAll(root); err != nil {
			log("remove %s: %v", root, err)
		}
	} else {
		log("keeping %s", root)
	}
	if len(createdFixed) > 0 && otherRunsLive(ns) {
		log("leaving %v: another run is going", createdFixed)
		createdFixed = nil
	}
	for _, p := range createdFixed {
		if err := os.RemoveAll(p); err != nil {
			log("remove %s: %v", p, err)
		}
	}
	for _, n := range append(workers, ns) {
		if out, err := exec.Command("ip", "netns", "delete", n).CombinedOutput(); err != nil {
			log("ip netns delete %s: %v: %s", n, err, out)
		}
	}
}

// killInNamespace SIGKILLs every process (but this one) in the named
// network namespace.
func killInNamespace(ns string, log logf) {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
			log("killing leftover process %d in %s", pid, ns)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// workerNamespaces lists the network namespaces of a run's cluster
// workers: <ns>-<worker> (cluster.go).
func workerNamespaces(ns string) []string {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return nil
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], ns+"-") {
			names = append(names, f[0])
		}
	}
	return names
}

// sweepStale cleans up after runs whose parent process was killed before its
// own sweep: their namespace (hwdra-e2e-<pid>) and root (/tmp/hwe2e-<pid>-*)
// outlive them.
func sweepStale() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	log := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "hwdra e2e: stale run: "+format+"\n", args...)
	}
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		pidStr, ok := strings.CutPrefix(fields[0], "hwdra-e2e-")
		if !ok || strings.Contains(pidStr, "-") {
			continue // not a run's, or a worker's: swept with its run's
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || syscall.Kill(pid, 0) == nil {
			continue // malformed, or its run is still going
		}
		log("sweeping namespace %s", fields[0])
		roots, _ := filepath.Glob(filepath.Join(os.TempDir(), "hwe2e-"+pidStr+"-*"))
		for _, root := range roots {
			sweep(fields[0], root, nil, true, log)
		}
		if len(roots) == 0 {
			sweep(fields[0], filepath.Join(os.TempDir(), "hwe2e-"+pidStr+"-none"), nil, true, log)
		}
	}
}

// killByCommandLine SIGKILLs every process (but this one) whose command line
// mentions dir: every component of a node is started with paths under it, and
// containerd's shims re-parent themselves away from containerd.
func killByCommandLine(dir string, log logf) {
	self := os.Getpid()
	needle := []byte(dir + "/")
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, needle) {
			continue
		}
		log("killing leftover process %d: %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " "))
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// machineKubepods lists the top-level cgroups of a kubelet with the
// machine's cgroup root (the suite's node) in every mounted hierarchy
// (cgroup v1 controllers and the unified one).
func machineKubepods() []string {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods")
	m, _ := filepath.Glob("/sys/fs/cgroup/kubepods")
	return append(dirs, m...)
}

// runCgroups lists the cgroup roots of the run ns's cluster workers
// (workerCgroupPrefix<pid>-<worker>: never another run's, which may be
// going beside it) and, with node, the machine's kubepods.
func runCgroups(ns string, node bool) []string {
	var dirs []string
	for _, pattern := range runCgroupPatterns(ns, node) {
		m, _ := filepath.Glob(pattern)
		dirs = append(dirs, m...)
	}
	return dirs
}

func runCgroupPatterns(ns string, node bool) []string {
	prefix := workerCgroupPrefix + strings.TrimPrefix(ns, "hwdra-e2e-") + "-"
	patterns := []string{"/sys/fs/cgroup/*/" + prefix + "*", "/sys/fs/cgroup/" + prefix + "*"}
	if node {
		patterns = append(patterns, "/sys/fs/cgroup/*/kubepods", "/sys/fs/cgroup/kubepods")
	}
	return patterns
}

// otherRunsLive says whether a run other than ns is going (its network
// namespace hwdra-e2e-<pid> exists and its process lives): the fixed
// paths may be its too.
func otherRunsLive(ns string) bool {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] == ns {
			continue
		}
		pidStr, ok := strings.CutPrefix(f[0], "hwdra-e2e-")
		if !ok || strings.Contains(pidStr, "-") {
			continue
		}
		if pid, err := strconv.Atoi(pidStr); err == nil && syscall.Kill(pid, 0) == nil {
			return true
		}
	}
	return false
}

// cleanupCgroups kills what still runs in kubepods and removes the cgroups,
// deepest first (a cgroup with children or tasks cannot be removed).
func cleanupCgroups(log logf, tops func() []string) {
	for attempt := 0; attempt < 50; attempt++ {
		var all []string
		for _, top := range tops() {
			_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					all = append(all, p)
				}
				return nil
			})
		}
		if len(all) == 0 {
			return
		}
		for _, dir := range all {
			for _, pid := range readPids(filepath.Join(dir, "cgroup.procs")) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		sort.Slice(all, func(i, j int) bool { return len(all[i]) > len(all[j]) })
		for _, dir := range all {
			_ = unix.Rmdir(dir)
		}
		// SIGKILLed processes leave their cgroups only once the kernel
		// has reaped them: no event to wait on here, so time passes.
		time.Sleep(100 * time.Millisecond)
	}
	log("cgroups left behind: %v", tops())
}

func readPids(file string) []int {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var mounts []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	sort.SliceStable(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	return mounts
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder lazily unmounts everything below dir, deepest first, until
// nothing is left (mounts may be stacked).
func unmountUnder(dir string, log logf) {
	for attempt := 0; attempt < 10; attempt++ {
		mounts := mountsUnder(dir)
		if len(mounts) == 0 {
			return
		}
		for _, mp := range mounts {
			if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && attempt > 0 {
				log("unmount %s: %v", mp, err)
			}
		}
	}
}
