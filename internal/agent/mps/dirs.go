// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package mps

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// A daemon's directories: its pipe directory, which every client mounts
// read-write (so anything in it may be a tenant's), its log directory,
// which only the agent and the daemon reach, and its shared memory, a
// tmpfs of its own, which the daemon and every client mount at /dev/shm.

// prepareDirs makes a daemon's directories ready for a launch. The pipe
// directory is emptied: what a client left there (a PID file, a
// control socket of its own, links) is gone before the daemon starts.
// A fresh daemon gets empty directories throughout; a daemon started
// again keeps its logs (regular files: anything else goes) and its
// shared memory, which its clients' containers hold mounted and may
// use for themselves. The directories themselves stay: client
// containers have them bound by inode.
func (m *Manager) prepareDirs(r record, fresh bool) error {
	d := m.Dirs(r.Spec.ID)
	for _, dir := range []string{d.Pipe, d.Log, d.Shm} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if err := clearDir(d.Pipe, func(os.FileInfo) bool { return true }); err != nil {
		return err
	}
	if err := clearDir(d.Log, func(fi os.FileInfo) bool { return fresh || !fi.Mode().IsRegular() }); err != nil {
		return err
	}
	if !r.ShmTmpfs {
		// Without root (tests), or a daemon of an earlier agent whose
		// clients have its directory on the node's disk: a directory,
		// which clients run as any user must reach.
		if fresh {
			if err := clearDir(d.Shm, func(os.FileInfo) bool { return true }); err != nil {
				return err
			}
		}
		return os.Chmod(d.Shm, 0o1777)
	}
	mounted, err := isTmpfs(d.Shm)
	switch {
	case err != nil:
		return err
	case mounted && fresh:
		return clearDir(d.Shm, func(os.FileInfo) bool { return true })
	case mounted:
		return nil
	}
	return mountShm(d.Shm, m.opts.ShmSize)
}

// clearDir removes the entries of dir that remove says to: links as
// links, directories with what is in them (os.RemoveAll follows no
// link).
func clearDir(dir string, remove func(os.FileInfo) bool) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	var errs []error
	for {
		names, err := f.Readdirnames(256)
		for _, name := range names {
			path := filepath.Join(dir, name)
			if fi, err := os.Lstat(path); err == nil && remove(fi) {
				errs = append(errs, os.RemoveAll(path))
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}

// mountShm mounts a daemon's shared memory: a tmpfs of size bytes that
// runs nothing (noexec), honours no set-user-ID bit and no device node,
// writable by clients of any user, files kept to their owners (mode
// 1777, as /dev/shm).
func mountShm(dir string, size int64) error {
	if err := unix.Mount("hwdra-mps-shm", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
		fmt.Sprintf("size=%d,mode=1777", size)); err != nil {
		return fmt.Errorf("MPS shared memory: mount a tmpfs on %s: %w", dir, err)
	}
	return nil
}

// isTmpfs reports whether a tmpfs is mounted on dir.
func isTmpfs(dir string) (bool, error) {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(real))
	if err != nil {
		return false, err
	}
	for _, mi := range mounts {
		if mi.FSType == "tmpfs" {
			return true, nil
		}
	}
	return false, nil
}

// unmountShm unmounts a daemon's shared memory (every mount on it). The
// tmpfs lives on in client containers that still have it mounted, and
// goes with the last.
func unmountShm(dir string) error {
	for range 8 {
		mounted, err := isTmpfs(dir)
		if err != nil || !mounted {
			return err
		}
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("MPS shared memory: unmount %s: %w", dir, err)
		}
	}
	return fmt.Errorf("MPS shared memory: %s is still mounted", dir)
}

// logTail is the end of a daemon's logs, for errors. The files are the
// agent's and the daemon's, but read as if they were not: opened without
// following a link, regular files only, the last bytes only.
func logTail(dir string) string {
	var out []string
	for _, name := range []string{daemonOutput, "control.log"} {
		if tail := readTail(filepath.Join(dir, name), 512); tail != "" {
			out = append(out, name+": "+tail)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return " (" + strings.Join(out, "; ") + ")"
}

// daemonOutput is where a daemon's standard output and error go, in its
// log directory (in the foreground, nvidia-cuda-mps-control writes its
// messages there).
const daemonOutput = "daemon.log"

// readTail reads the last n bytes of a regular file, not following a
// link.
func readTail(path string, n int64) string {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return ""
	}
	off := max(0, st.Size()-n)
	data, _ := io.ReadAll(io.NewSectionReader(f, off, n))
	return strings.TrimSpace(string(data))
}
