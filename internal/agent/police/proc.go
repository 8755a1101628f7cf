package police

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/procstat"
)

// proc is one process as /proc shows it, held by a pidfd: a signal sent
// through it reaches this process, never one that took its PID later.
type proc struct {
	pidfd int
	start uint64 // start time (clock ticks after boot): with the PID, its identity
	// pod and container are what its cgroup names (containerOf); inPod
	// false for a process of no pod, whose command (comm) is read.
	pod       types.UID
	container string
	inPod     bool
	comm      string
	environ   []byte // nil where it could not be read
}

// errGone: the process exited (or is a zombie, whose context is gone).
var errGone = errors.New("process gone")

// inspect opens the process with a pidfd first, then reads /proc under
// root, then checks through the pidfd that it still lives: what was read
// was that process's, as a PID is not reused while its process exists.
func inspect(root string, pid uint32) (*proc, error) {
	fd, err := unix.PidfdOpen(int(pid), 0)
	if errors.Is(err, unix.ESRCH) {
		return nil, errGone
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd_open(%d): %w", pid, err)
	}
	p := &proc{pidfd: fd}
	if err := p.read(filepath.Join(root, strconv.FormatUint(uint64(pid), 10))); err != nil {
		p.close()
		return nil, err
	}
	if err := unix.PidfdSendSignal(fd, 0, nil, 0); err != nil {
		p.close()
		return nil, errGone
	}
	return p, nil
}

func (p *proc) read(dir string) error {
	stat, err := os.ReadFile(filepath.Join(dir, "stat"))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return errGone
	}
	if err != nil {
		return err
	}
	state, start, err := procstat.Parse(stat)
	if err != nil {
		return fmt.Errorf("%s/stat: %w", dir, err)
	}
	if state == 'Z' || state == 'X' {
		return errGone
	}
	p.start = start
	cgroup, err := os.ReadFile(filepath.Join(dir, "cgroup"))
	if err != nil {
		return fmt.Errorf("%s/cgroup: %w", dir, err)
	}
	p.pod, p.container, p.inPod = containerOf(string(cgroup))
	if !p.inPod {
		// Only a process outside pods may be the MPS server.
		if comm, err := os.ReadFile(filepath.Join(dir, "comm")); err == nil {
			p.comm = strings.TrimSpace(string(comm))
		}
	}
	if env, err := os.ReadFile(filepath.Join(dir, "environ")); err == nil {
		p.environ = env
	}
	return nil
}

// kill sends SIGKILL through the pidfd: the process cannot catch it, and
// its GPU context goes with it.
func (p *proc) kill() error {
	if err := unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

func (p *proc) close() { _ = unix.Close(p.pidfd) }
