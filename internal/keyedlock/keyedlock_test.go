// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package keyedlock

import (
	"sync"
	"testing"
	"time"
)

func TestSharedKeysExcludeDisjointKeysDoNot(t *testing.T) {
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
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	<-blocked
}

func TestNoDeadlockOnOppositeOrders(t *testing.T) {
	var l Locks
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(2)
		go func() { defer wg.Done(); l.Lock("x", "y")() }()
		go func() { defer wg.Done(); l.Lock("y", "x")() }()
	}
	wg.Wait()
}

func TestUnusedKeysAreFreed(t *testing.T) {
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
