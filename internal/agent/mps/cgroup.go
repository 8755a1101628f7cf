// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package mps

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Cgroup says where a daemon's processes live.
type Cgroup string

const (
	// CgroupSame: in the agent's cgroups. Right where the agent runs as a
	// plain process: a daemon in a session of its own outlives it. No
	// cgroup of its own, so no memory limit.
	CgroupSame Cgroup = ""
	// CgroupBesidePod: in a cgroup of its own, "hwdra-mps-<id>", beside
	// the agent's pod's (under the pod's parent, the QoS class's cgroup),
	// in every hierarchy where the agent is in a container of a pod: the
	// container runtime kills what is left in a container's cgroup when
	// it stops, the kubelet what is left in a pod's, so an MPS server in
	// them would end with the agent's pod at every rolling update.
	CgroupBesidePod Cgroup = "beside-pod"
)

// Any other Cgroup is an absolute cgroup path ("/hwdra-mps.slice"): the
// daemon's cgroup is made under it, in each hierarchy with the memory
// controller (an agent run as a service beside the daemons, and tests).

// Valid reports whether c is a Cgroup the launcher understands.
func (c Cgroup) Valid() bool {
	return c == CgroupSame || c == CgroupBesidePod || strings.HasPrefix(string(c), "/") && !strings.Contains(string(c), "..")
}

// cgroupName is daemon id's own cgroup: it holds the daemon and the MPS
// servers it starts, nothing else (a tenant cannot create cgroups or move
// processes on the node), so its name says which processes are the
// daemon's.
func cgroupName(id string) string { return "hwdra-mps-" + id }

// cgroupDir is the daemon's cgroup in one hierarchy.
type cgroupDir struct {
	dir string
	// memory: the hierarchy has the memory controller; v2: it is the
	// unified hierarchy.
	memory, v2 bool
}

// daemonCgroups are the directories of the cgroup name in each
// hierarchy where mode puts it. It runs in the launcher: beside-pod
// enters the node's cgroup namespace on this thread.
func daemonCgroups(mode Cgroup, name string) ([]cgroupDir, error) {
	if mode == CgroupBesidePod {
		return besidePodCgroups(name)
	}
	mounts, err := cgroupMounts("/proc/self/mountinfo", "/")
	if err != nil {
		return nil, err
	}
	var out []cgroupDir
	for key, m := range mounts {
		d := cgroupDir{v2: key == ""}
		if d.memory = hasMemory(key, m); !d.memory {
			continue
		}
		rel, err := filepath.Rel(m.root, string(mode))
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			continue // a mount of another subtree
		}
		d.dir = filepath.Join(m.dir, rel, name)
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no hierarchy with the memory controller holds %s", mode)
	}
	return out, nil
}

// hasMemory reports whether a hierarchy (by its key, cgroupMounts) has
// the memory controller.
func hasMemory(key string, m cgroupMount) bool {
	if key != "" {
		for _, c := range strings.Split(key, ",") {
			if c == "memory" {
				return true
			}
		}
		return false
	}
	data, err := os.ReadFile(filepath.Join(m.dir, "cgroup.controllers"))
	return err == nil && strings.Contains(" "+strings.TrimSpace(string(data))+" ", " memory ")
}

// besidePodCgroups are the cgroup name beside the agent's pod in every
// hierarchy where it is in a pod's container (two levels below where the
// kubelet keeps the pod's QoS class). The cgroups are seen as the node
// sees them (a cgroup outside a cgroup namespace is out of reach from
// inside it): through the namespaces and root of the node process that
// started the agent's container (nodeProcess).
func besidePodCgroups(name string) ([]cgroupDir, error) {
	node, err := nodeProcess()
	if err != nil {
		return nil, err
	}
	proc := "/proc/" + strconv.Itoa(node)
	if err := enterCgroupNamespace(proc); err != nil {
		return nil, err
	}
	mounts, err := cgroupMounts(proc+"/mountinfo", proc+"/root")
	if err != nil {
		return nil, err
	}
	own, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, err
	}
	var out []cgroupDir
	for _, line := range strings.Split(strings.TrimSpace(string(own)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		m, ok := mounts[parts[1]]
		if !ok {
			continue // a hierarchy the node does not mount
		}
		dir, ok := besidePod(parts[2], m, name)
		if !ok {
			continue // not in a pod's container in this hierarchy
		}
		out = append(out, cgroupDir{dir: dir, memory: hasMemory(parts[1], m), v2: parts[1] == ""})
	}
	if len(out) == 0 {
		return nil, errors.New("the agent is in no pod's container cgroup: nothing to leave (run it with the same cgroup as the daemons instead)")
	}
	return out, nil
}

// joinCgroups makes the daemon's cgroups, limits their memory to
// memoryMax bytes (0: no limit) and moves this process into them. A
// limit asked for must be set somewhere.
func joinCgroups(dirs []cgroupDir, memoryMax int64) error {
	limited := false
	for _, d := range dirs {
		if err := os.MkdirAll(d.dir, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d.dir, err)
		}
		if !d.v2 {
			if err := inheritCpuset(d.dir); err != nil {
				return fmt.Errorf("cgroup %s: %w", d.dir, err)
			}
		}
		if d.memory && memoryMax > 0 {
			if err := limitMemory(d, memoryMax); err != nil {
				return fmt.Errorf("cgroup %s: %w", d.dir, err)
			}
			limited = true
		}
	}
	if memoryMax > 0 && !limited {
		return fmt.Errorf("no memory controller in the daemon's cgroups (%d hierarchies): its memory limit cannot be set", len(dirs))
	}
	for _, d := range dirs {
		// "0" is the writing process, whatever its PID is where.
		if err := os.WriteFile(filepath.Join(d.dir, "cgroup.procs"), []byte("0"), 0o644); err != nil {
			return fmt.Errorf("cgroup %s: %w", d.dir, err)
		}
	}
	return nil
}

// limitMemory sets a cgroup's memory limit: memory.max (v2; its parent
// must hand the controller down) or memory.limit_in_bytes (v1).
func limitMemory(d cgroupDir, memoryMax int64) error {
	v := []byte(strconv.FormatInt(memoryMax, 10))
	if !d.v2 {
		return os.WriteFile(filepath.Join(d.dir, "memory.limit_in_bytes"), v, 0o644)
	}
	if _, err := os.Stat(filepath.Join(d.dir, "memory.max")); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(filepath.Join(filepath.Dir(d.dir), "cgroup.subtree_control"), []byte("+memory"), 0o644); err != nil {
			return fmt.Errorf("handing the memory controller down to it: %w", err)
		}
	}
	return os.WriteFile(filepath.Join(d.dir, "memory.max"), v, 0o644)
}

// inheritCpuset gives a new cpuset cgroup (v1) its parent's CPUs and
// memory nodes: it has none until then, and no process can join it.
func inheritCpuset(dir string) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		cur, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || strings.TrimSpace(string(cur)) != "" {
			continue
		}
		parent, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f), parent, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// removeCgroups removes the daemon's cgroups once they are empty; one
// that is gone already is fine. A process that ended may hold its cgroup
// a moment, until its parent reaps it (the agent, or the node's init for
// a daemon of an earlier agent).
func removeCgroups(dirs []cgroupDir) error {
	var errs []error
	for _, d := range dirs {
		deadline := time.Now().Add(5 * time.Second)
		err := unix.Rmdir(d.dir)
		for errors.Is(err, unix.EBUSY) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			err = unix.Rmdir(d.dir)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			procs, _ := os.ReadFile(filepath.Join(d.dir, "cgroup.procs"))
			errs = append(errs, fmt.Errorf("cgroup %s (processes %q): %w", d.dir, strings.Fields(string(procs)), err))
		}
	}
	return errors.Join(errs...)
}

// nodeProcess is the nearest ancestor of the agent (this launcher's
// parent) in another mount namespace than the agent's: the container
// runtime's shim, which lives in the node's namespaces. Not PID 1: a
// sandbox may keep even root from reading PID 1's namespaces (the
// real-node suite's machine does).
func nodeProcess() (int, error) {
	agent := os.Getppid()
	own, err := nsInode(agent, "mnt")
	if err != nil {
		return 0, err
	}
	for pid := agent; pid > 1; {
		ppid, err := parentOf(pid)
		if err != nil {
			return 0, err
		}
		if ppid <= 0 {
			break
		}
		ns, err := nsInode(ppid, "mnt")
		if err != nil {
			return 0, err
		}
		if ns != own {
			return ppid, nil
		}
		pid = ppid
	}
	return 0, errors.New("no ancestor of the agent is outside its mount namespace: the agent runs in no container (run it with the same cgroup as the daemons instead)")
}

// nsInode identifies a process's namespace of a kind.
func nsInode(pid int, kind string) (uint64, error) {
	var st unix.Stat_t
	path := fmt.Sprintf("/proc/%d/ns/%s", pid, kind)
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return st.Ino, nil
}

// parentOf is a process's parent's PID (0 for none).
func parentOf(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no PPid", pid)
}

// enterCgroupNamespace moves this thread into the cgroup namespace of
// the process at proc (/proc/<pid>), if it is in another one.
func enterCgroupNamespace(proc string) error {
	var mine, node unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/cgroup", &mine); err != nil {
		return fmt.Errorf("/proc/thread-self/ns/cgroup: %w", err)
	}
	if err := unix.Stat(proc+"/ns/cgroup", &node); err != nil {
		return fmt.Errorf("%s/ns/cgroup: %w", proc, err)
	}
	if mine.Ino == node.Ino && mine.Dev == node.Dev {
		return nil
	}
	f, err := os.Open(proc + "/ns/cgroup")
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("entering the node's cgroup namespace: %w", err)
	}
	return nil
}

// cgroupMount is where a hierarchy is mounted, as this process reaches it.
type cgroupMount struct {
	dir  string // mount point, under the node process's root
	root string // the cgroup at the mount point
}

// cgroupMounts reads a mountinfo's cgroup mounts by the controller field
// of /proc/<pid>/cgroup they serve: "cpu,cpuacct", "name=systemd", ""
// (the unified hierarchy), their mount points under root.
func cgroupMounts(mountinfo, root string) (map[string]cgroupMount, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]cgroupMount{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent maj:min root mountpoint options [optional...] - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(tail) < 3 {
			continue
		}
		m := cgroupMount{dir: filepath.Join(root, unescape(fields[4])), root: unescape(fields[3])}
		switch tail[0] {
		case "cgroup2":
			if _, seen := out[""]; !seen {
				out[""] = m
			}
		case "cgroup":
			var ctrls []string
			for _, o := range strings.Split(tail[2], ",") {
				if o != "rw" && o != "ro" && !strings.HasPrefix(o, "release_agent=") && o != "clone_children" && o != "xattr" && o != "noprefix" && o != "cpuset_v2_mode" {
					ctrls = append(ctrls, o)
				}
			}
			key := strings.Join(ctrls, ",")
			if _, seen := out[key]; !seen {
				out[key] = m
			}
		}
	}
	return out, sc.Err()
}

// unescape undoes mountinfo's octal escapes of spaces and the like.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// besidePod is the directory of cgroup name beside the pod of a
// container cgroup path (…/<QoS class>/<pod>/<container>), in mount m;
// false where the path is not that deep or the cgroup is not under the
// mount.
func besidePod(path string, m cgroupMount, name string) (string, bool) {
	parts := strings.FieldsFunc(path, func(r rune) bool { return r == '/' })
	if len(parts) < 3 {
		return "", false
	}
	target := "/" + filepath.Join(append(parts[:len(parts)-2:len(parts)-2], name)...)
	rel, err := filepath.Rel(m.root, target)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return filepath.Join(m.dir, rel), true
}
