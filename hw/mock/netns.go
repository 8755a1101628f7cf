package mock

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"

	"github.com/vishvananda/netns"
)

// NewNetns creates a throwaway named network namespace (root only),
// without moving the caller into it, and returns its path and a function
// that deletes it. Tests stand it in for the host's namespace (where the
// mock puts its veth stand-ins, see VethEnv) or for a pod's.
func NewNetns(prefix string) (path string, remove func() error, err error) {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := prefix + hex.EncodeToString(suffix)
	ns, err := newNamedNetns(name)
	if err != nil {
		return "", nil, err
	}
	ns.Close()
	path = filepath.Join("/run/netns", name)
	return path, func() error {
		err := netns.DeleteNamed(name)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}, nil
}
