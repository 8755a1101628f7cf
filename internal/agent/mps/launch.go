// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package mps

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/moby/sys/capability"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// The daemon is started through this binary, run again under the name
// launcherName: in a mount namespace of its own it puts the daemon's
// shared memory at /dev/shm, detaches the other daemons' and covers the
// service account token; it moves into the daemon's cgroup and limits
// its memory; it keeps only the capabilities a control daemon needs,
// sets no_new_privs, and then becomes nvidia-cuda-mps-control -f with a
// minimal environment. Go cannot do these between fork and exec, so a
// process of its own does, on the thread that execs (namespaces,
// capabilities and no_new_privs are per thread until exec).
const launcherName = "hwdra-mps-launch"

// statusFD is where the launcher says why it failed; it is closed on
// exec, so the agent reads end of file once the daemon runs.
const statusFD = 3

func init() {
	if len(os.Args) > 0 && os.Args[0] == launcherName {
		if err := launcher(os.Args[1:]); err != nil {
			status := os.NewFile(statusFD, "status")
			fmt.Fprintf(status, "%v", err)
			fmt.Fprintf(os.Stderr, "%s: %v\n", launcherName, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// request is what the agent asks of the launcher (its first argument,
// JSON); the rest of its arguments are the program and its arguments.
type request struct {
	// Remove: remove the daemon's cgroups (CgroupName under Cgroup),
	// start nothing.
	Remove bool `json:"remove,omitempty"`
	// Shm is bound on /dev/shm; Detach: every mount below it is
	// detached (the other daemons' shared memory). Mask are directories
	// covered with an empty read-only tmpfs. Empty: the mounts are left
	// as they are (no mount namespace of its own).
	Shm    string   `json:"shm,omitempty"`
	Detach string   `json:"detach,omitempty"`
	Mask   []string `json:"mask,omitempty"`
	// Cgroup and CgroupName: where the daemon's cgroup is, and its name
	// (empty: the agent's cgroups); MemoryMax its memory limit in bytes.
	Cgroup     Cgroup `json:"cgroup,omitempty"`
	CgroupName string `json:"cgroupName,omitempty"`
	MemoryMax  int64  `json:"memoryMax,omitempty"`
	// Capabilities are all the daemon keeps.
	Capabilities []capability.Cap `json:"capabilities"`
	// Env is the daemon's whole environment.
	Env []string `json:"env"`
	// Program is the path of what the launcher becomes; its arguments
	// (argv[0] too) follow the request.
	Program string `json:"program,omitempty"`
}

// launcher runs in the launcher process.
func launcher(args []string) error {
	var req request
	if len(args) < 1 || json.Unmarshal([]byte(args[0]), &req) != nil {
		return errors.New("usage: <request JSON> [argv...]")
	}
	unix.CloseOnExec(statusFD)
	runtime.LockOSThread()
	if req.Remove {
		return removeDaemonCgroups(req)
	}
	if len(args) < 2 || req.Program == "" {
		return errors.New("no program to run")
	}
	argv := args[1:]
	// The program is opened before the mounts change: it may be under a
	// path that is covered (a mock driver root in a test's temp
	// directory).
	bin, err := os.Open(req.Program)
	if err != nil {
		return err
	}
	if req.Shm != "" {
		if err := isolateMounts(req); err != nil {
			return err
		}
	}
	if req.CgroupName != "" {
		dirs, err := daemonCgroups(req.Cgroup, req.CgroupName)
		if err != nil {
			return err
		}
		if err := joinCgroups(dirs, req.MemoryMax); err != nil {
			return err
		}
	}
	if err := dropPrivileges(req.Capabilities); err != nil {
		return err
	}
	if err := syscall.Exec(fmt.Sprintf("/proc/self/fd/%d", bin.Fd()), argv, req.Env); err != nil {
		return fmt.Errorf("exec %s: %w", req.Program, err)
	}
	return nil
}

// removeDaemonCgroups removes a daemon's cgroups; their processes are
// ended already.
func removeDaemonCgroups(req request) error {
	dirs, err := daemonCgroups(req.Cgroup, req.CgroupName)
	if err != nil {
		return err
	}
	return removeCgroups(dirs)
}

// isolateMounts makes the daemon's mounts, in the mount namespace of its
// own that the agent started it in (its mounts private, so nothing here
// reaches the agent or the node): its shared memory at /dev/shm, no other
// daemon's (a daemon's namespace would otherwise keep each tmpfs that
// existed at its start alive until it ends), and the masked directories
// covered.
func isolateMounts(req request) error {
	if err := unix.Mount(req.Shm, "/dev/shm", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on /dev/shm: %w", req.Shm, err)
	}
	if req.Detach != "" {
		below := filepath.Clean(req.Detach) + "/"
		mounts, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
			return !strings.HasPrefix(m.Mountpoint, below), false
		})
		if err != nil {
			return err
		}
		// The deepest first.
		sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].Mountpoint) > len(mounts[j].Mountpoint) })
		for _, m := range mounts {
			if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("detach %s: %w", m.Mountpoint, err)
			}
		}
	}
	for _, dir := range req.Mask {
		st, err := os.Stat(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil || !st.IsDir() {
			return fmt.Errorf("cover %s: not a directory (%v)", dir, err)
		}
		// Covering the directory hides every mount below it too (the
		// token's tmpfs).
		if err := unix.Mount("hwdra-mask", dir, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555"); err != nil {
			return fmt.Errorf("cover %s: %w", dir, err)
		}
	}
	return nil
}

// DaemonCapabilities are the capabilities a control daemon keeps: it
// starts each MPS server with the user and group IDs of the client it is
// for (SETUID, SETGID), ends servers that run as other users (KILL), and
// makes its pipes and logs for them (CHOWN, FOWNER, DAC_OVERRIDE: the
// pipe and log directories and the device nodes are root's). MPS runs
// without any capability for a single user (NVIDIA's MPS guide has users
// start their own daemons); none of the others (SYS_ADMIN, NET_ADMIN,
// SYS_PTRACE, SYS_MODULE, MKNOD, ...) has a use in it.
var DaemonCapabilities = []capability.Cap{
	capability.CAP_CHOWN, capability.CAP_DAC_OVERRIDE, capability.CAP_FOWNER,
	capability.CAP_KILL, capability.CAP_SETGID, capability.CAP_SETUID,
}

// dropPrivileges keeps only caps, in every set (the bounding set too:
// root gets it back at exec otherwise), and sets no_new_privs, so
// that nothing the daemon runs gains more (a set-user-ID program).
func dropPrivileges(caps []capability.Cap) error {
	c, err := capability.NewPid2(0)
	if err != nil {
		return err
	}
	if err := c.Load(); err != nil {
		return err
	}
	var keep []capability.Cap
	for _, k := range caps {
		if c.Get(capability.PERMITTED, k) { // what the agent has itself
			keep = append(keep, k)
		}
	}
	c.Clear(capability.CAPS | capability.BOUNDS | capability.AMBS)
	c.Set(capability.EFFECTIVE|capability.PERMITTED|capability.BOUNDING, keep...)
	kinds := capability.CAPS | capability.AMBS
	root := os.Geteuid() == 0
	if root {
		// Only root gets its bounding set back at exec; a user cannot
		// drop it, and has no capability after exec anyway.
		kinds |= capability.BOUNDS
	}
	if err := c.Apply(kinds); err != nil {
		return fmt.Errorf("dropping capabilities: %w", err)
	}
	last, err := capability.LastCap()
	if err != nil {
		return err
	}
	for k := capability.Cap(0); root && k <= last; k++ {
		if on, err := capability.GetBound(k); err == nil && on && !slices.Contains(keep, k) {
			return fmt.Errorf("dropping capabilities: %s stays in the bounding set (no CAP_SETPCAP)", k)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	return nil
}
