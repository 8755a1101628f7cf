// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nicsim

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/hwdra/hwdra/internal/hw"
)

// RDMAMove is one MoveRDMA call and how the "kernel" answered it.
type RDMAMove struct {
	Device, From, To string
	Err              error
}

// RDMARecorder is the mock's hw.RDMANetns: it knows the node's RDMA
// devices and which namespace each is in, refuses what the kernel
// refuses, and records every call.
type RDMARecorder struct {
	mu        sync.Mutex
	exclusive bool
	where     map[string]string // device -> namespace path ("" the host's)
	moves     []RDMAMove
}

var _ hw.RDMANetns = (*RDMARecorder)(nil)

func newRDMARecorder(devices []string, exclusive bool) *RDMARecorder {
	r := &RDMARecorder{exclusive: exclusive, where: map[string]string{}}
	for _, d := range devices {
		r.where[d] = ""
	}
	return r
}

// Exclusive implements hw.RDMANetns: the profile's rdmaNetns.
func (r *RDMARecorder) Exclusive() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exclusive, nil
}

// MoveRDMA implements hw.RDMANetns. In shared mode the kernel moves
// nothing (EOPNOTSUPP); a device that is not in from is invisible there
// (ENODEV).
func (r *RDMARecorder) MoveRDMA(name, from, to string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	at, ok := r.where[name]
	switch {
	case !r.exclusive:
		err = fmt.Errorf("mock: RDMA device %s: netns in shared mode: %w", name, unix.EOPNOTSUPP)
	case !ok || at != from:
		err = fmt.Errorf("mock: RDMA device %s is not in namespace %q: %w", name, from, unix.ENODEV)
	default:
		r.where[name] = to
	}
	r.moves = append(r.moves, RDMAMove{Device: name, From: from, To: to, Err: err})
	return err
}

// setHome puts every device in the namespace at path, where the host's
// netdevs are (the veth stand-ins' namespace).
func (r *RDMARecorder) setHome(path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for d := range r.where {
		r.where[d] = path
	}
}

// Where is the namespace an RDMA device is in ("" the host's).
func (r *RDMARecorder) Where(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.where[name]
}

// Moves returns every MoveRDMA call so far, in order.
func (r *RDMARecorder) Moves() []RDMAMove {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]RDMAMove(nil), r.moves...)
}
