package mps

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The daemon is started through this binary, run again under the name
// launcherName: in a mount namespace of its own it puts the daemon's
// shared-memory directory at /dev/shm, leaves the agent's pod cgroup if
// asked, and then becomes nvidia-cuda-mps-control -d. Go cannot mount or
// move cgroups between fork and exec, so a process of its own does it.
const launcherName = "hwdra-mps-launch"

func init() {
	if len(os.Args) > 0 && os.Args[0] == launcherName {
		if err := launch(os.Args[1:]); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", launcherName, err)
			os.Exit(1)
		}
	}
}

// Cgroup says where a daemon's processes live.
type Cgroup string

const (
	// CgroupSame: in the agent's cgroups. Right where the agent runs as a
	// plain process: a daemon in a session of its own outlives it.
	CgroupSame Cgroup = ""
	// CgroupBesidePod: in a cgroup "hwdra-mps" beside the agent's pod's
	// (the pod's parent, the QoS class's cgroup), in every hierarchy
	// where the agent is in a container of a pod: the container runtime
	// kills what is left in a container's cgroup when it stops, the
	// kubelet what is left in a pod's, so an MPS server in them would end
	// with the agent's pod at every rolling update.
	CgroupBesidePod Cgroup = "beside-pod"
)

// besidePodName is the cgroup the daemons move to.
const besidePodName = "hwdra-mps"

// launch runs in the launcher: args are the shared-memory directory ("":
// leave /dev/shm), the Cgroup and the program with its arguments.
func launch(args []string) error {
	if len(args) < 3 {
		return errors.New("usage: <shm dir> <cgroup> <program> [args...]")
	}
	shm, cgroup, prog := args[0], Cgroup(args[1]), args[2:]
	// Namespaces are per thread, and exec keeps the calling thread's.
	runtime.LockOSThread()
	// The program is opened before /dev/shm is covered: it may be there
	// (a mock driver root in a test's temp directory).
	bin, err := os.Open(prog[0])
	if err != nil {
		return err
	}
	if shm != "" {
		// The agent started this process in a mount namespace of its own
		// (its mounts private): the bind stays in here.
		if err := unix.Mount(shm, "/dev/shm", "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on /dev/shm: %w", shm, err)
		}
	}
	if cgroup == CgroupBesidePod {
		if err := leavePod(); err != nil {
			return err
		}
	}
	if err := syscall.Exec(fmt.Sprintf("/proc/self/fd/%d", bin.Fd()), prog, os.Environ()); err != nil {
		return fmt.Errorf("exec %s: %w", prog[0], err)
	}
	return nil
}

// leavePod moves this process into a cgroup beside its pod's, in every
// hierarchy where it is in a pod's container (two levels below where
// the kubelet keeps the pod's QoS class). The cgroups are seen as the
// node sees them (a cgroup outside a cgroup namespace is out of reach
// from inside it): through the namespaces and root of the node process
// that started the agent's container (nodeProcess).
func leavePod() error {
	node, err := nodeProcess()
	if err != nil {
		return err
	}
	proc := "/proc/" + strconv.Itoa(node)
	if err := enterCgroupNamespace(proc); err != nil {
		return err
	}
	mounts, err := cgroupMounts(proc+"/mountinfo", proc+"/root")
	if err != nil {
		return err
	}
	own, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return err
	}
	moved := 0
	for _, line := range strings.Split(strings.TrimSpace(string(own)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		m, ok := mounts[parts[1]]
		if !ok {
			continue // a hierarchy the node does not mount
		}
		dir, ok := besidePod(parts[2], m)
		if !ok {
			continue // not in a pod's container in this hierarchy
		}
		if err := join(dir); err != nil {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		moved++
	}
	if moved == 0 {
		return errors.New("the agent is in no pod's container cgroup: nothing to leave (run it with the same cgroup as the daemons instead)")
	}
	return nil
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

// besidePod is the directory of the cgroup beside the pod of a container
// cgroup path (…/<QoS class>/<pod>/<container>), in mount m; false where
// the path is not that deep or the cgroup is not under the mount.
func besidePod(path string, m cgroupMount) (string, bool) {
	parts := strings.FieldsFunc(path, func(r rune) bool { return r == '/' })
	if len(parts) < 3 {
		return "", false
	}
	target := "/" + filepath.Join(append(parts[:len(parts)-2:len(parts)-2], besidePodName)...)
	rel, err := filepath.Rel(m.root, target)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return filepath.Join(m.dir, rel), true
}

// join makes the cgroup and moves this process into it. A new cpuset
// (cgroup v1) has no CPUs or memory nodes until given its parent's.
func join(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
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
	// "0" is the writing process, whatever its PID is where.
	return os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte("0"), 0o644)
}
