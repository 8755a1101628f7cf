package mock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"
)

// Hardware is a running mock node: an nvml.Interface that behaves like the
// profile's GPUs and a fake sysfs tree holding its PCI devices and NICs.
// Only hardware is mocked: the project's backends run on these unchanged.
type Hardware struct {
	Profile Profile
	// NVML is go-nvml's mock server, wrapped so it refuses what the
	// hardware refuses.
	NVML nvml.Interface
	// Sysfs is the root of the fake sysfs tree (what /sys is on a host).
	Sysfs string

	dir    string
	ctl    *control    // saves state and paces calls (persist.go)
	driver *driverGate // the NVIDIA driver being loaded (nil: no GPUs)
	faults *faultInbox // injected faults from other processes (inject.go)
}

// Open loads a profile (built-in name or YAML file) and builds it.
func Open(spec string) (*Hardware, error) {
	p, err := Load(spec)
	if err != nil {
		return nil, err
	}
	return New(p)
}

// New builds the mock hardware of a profile in a fresh temp directory, or
// in $HWDRA_MOCK_DIR, restoring the state an earlier process left there
// (see DirEnv).
func New(p Profile) (*Hardware, error) {
	h := &Hardware{Profile: p}
	saved, err := h.openDir()
	if err != nil {
		return nil, err
	}
	h.Sysfs = filepath.Join(h.dir, "sys")
	h.ctl.quiet.Store(true) // building is no change of state
	if err := os.MkdirAll(h.Sysfs, 0o755); err != nil {
		return nil, errors.Join(err, h.Close())
	}
	if err := h.buildGPUs(); err != nil {
		return nil, errors.Join(fmt.Errorf("mock profile %q: %w", p.Name, err), h.Close())
	}
	if err := h.buildNICs(); err != nil {
		return nil, errors.Join(fmt.Errorf("mock profile %q: %w", p.Name, err), h.Close())
	}
	if err := h.start(saved); err != nil {
		return nil, errors.Join(err, h.Close())
	}
	if err := h.startInbox(); err != nil {
		return nil, errors.Join(err, h.Close())
	}
	return h, nil
}

// tempRoot is where mock trees go. The kernel keeps sysfs in memory, and
// so does the mock where it can: on disk, building a vGPU host's thousands
// of sysfs files takes seconds. An explicit TMPDIR wins.
func tempRoot() string {
	if os.Getenv("TMPDIR") != "" {
		return ""
	}
	if unix.Access("/dev/shm", unix.W_OK) == nil {
		return "/dev/shm"
	}
	return ""
}

// Close removes everything the mock created; a persistent mock (DirEnv)
// keeps its directory, state and trees, as hardware outlives its users.
func (h *Hardware) Close() error {
	h.faults.close()
	return errors.Join(h.closeNICs(), h.ctl.close())
}
