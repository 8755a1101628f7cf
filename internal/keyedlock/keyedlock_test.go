// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package keyedlock

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hwdra/hwdra/internal/waitfor"
)

func TestSharedKeysExcludeDisjointKeysDoNot(t *testing.T) {
	t.Parallel()
	var l Locks
	unlock := l.Lock("b", "a", "a")
	other := make(chan struct{})
	go func() { defer close(other); l.Lock("c")() }()
	select {
	case <-other:
	case <-time.After(5 * time.Second):
		t.Fatal("a disjoint key waited")
	}
	blocked := make(chan struct{})
	go func() { defer close(blocked); l.Lock("a", "z")() }()
	select {
	case <-blocked:
		t.Fatal("a shared key did not wait")
	case <-time.After(50 * time.Millisecond): // it must not finish: real time passes to show it
	}
	unlock()
	<-blocked
}

// TestNoDeadlockOnOppositeOrders: a caller asking for y and x takes x
// first, as one asking for x and y does, so while it waits for x it holds
// nothing: y stays free for x's holder, which would deadlock on it were
// the keys taken in the order given. Then many callers in both orders all
// finish, each alone with its keys.
func TestNoDeadlockOnOppositeOrders(t *testing.T) {
	t.Parallel()
	var l Locks
	unlockX := l.Lock("x")
	done := make(chan struct{})
	go func() { defer close(done); l.Lock("y", "x")() }()
	waitfor.True(t, "the second caller waiting for x", 10*time.Second, func() bool { return l.refs("x") == 2 })
	if n := l.refs("y"); n != 0 {
		t.Fatalf("a caller waiting for x holds or waits for y (%d refs): it took the keys in the order given", n)
	}
	unlockY := l.Lock("y") // free, so this returns at once
	unlockY()
	unlockX()
	<-done

	var inside, total atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		for _, keys := range [][]string{{"x", "y"}, {"y", "x"}} {
			wg.Go(func() {
				unlock := l.Lock(keys...)
				defer unlock()
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d callers hold x and y at once", n)
				}
				total.Add(1)
				inside.Add(-1)
			})
		}
	}
	wg.Wait()
	if n := total.Load(); n != 400 {
		t.Errorf("%d of 400 callers held the keys", n)
	}
	if n := l.Len(); n != 0 {
		t.Errorf("%d keys kept after every holder unlocked", n)
	}
}

// refs is the number of holders and waiters of key.
func (l *Locks) refs(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.locks[key]; e != nil {
		return e.refs
	}
	return 0
}

func TestUnusedKeysAreFreed(t *testing.T) {
	t.Parallel()
	var l Locks
	var wg sync.WaitGroup
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); l.Lock("shared", string(rune('a'+i%26)))() }()
	}
	wg.Wait()
	if n := l.Len(); n != 0 {
		t.Fatalf("%d keys kept after every holder unlocked", n)
	}
}
