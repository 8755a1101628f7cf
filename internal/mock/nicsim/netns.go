// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nicsim

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"runtime"

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

// newNamedNetns creates a named namespace without moving the caller:
// netns.NewNamed switches the calling thread into it, so it runs on a
// locked thread of its own that switches back; a thread that cannot switch
// back stays locked and dies with its goroutine rather than serve other Go
// code from the wrong namespace.
func newNamedNetns(name string) (netns.NsHandle, error) {
	type result struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- result{err: err}
			return // thread exits locked
		}
		defer orig.Close()
		ns, err := netns.NewNamed(name)
		if err != nil {
			ch <- result{err: err}
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
			return
		}
		if err := netns.Set(orig); err != nil {
			ch <- result{ns: ns}
			return // thread exits locked
		}
		runtime.UnlockOSThread()
		ch <- result{ns: ns}
	}()
	r := <-ch
	return r.ns, r.err
}
