// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package health

import "sync"

// Broadcast tells any number of waiters that something changed.
type Broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

// NewBroadcast returns a Broadcast with nothing changed yet.
func NewBroadcast() *Broadcast { return &Broadcast{ch: make(chan struct{})} }

// Changed returns a channel closed at the next Notify.
func (b *Broadcast) Changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

// Notify wakes every waiter; it never blocks.
func (b *Broadcast) Notify() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.ch)
	b.ch = make(chan struct{})
}
