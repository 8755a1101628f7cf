// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package keyedlock is one mutex per key (a claim, a GPU, a PF), created on
// demand and freed when unused, so that work on different devices runs
// concurrently and a long-running agent does not keep a mutex for every
// claim it ever saw.
//
// Not k8s.io/utils/keymutex: its hashed mutexes are shared by keys that
// hash alike, and a caller holding several keys at once would deadlock on
// itself when two of them share one.
package keyedlock

import (
	"sort"
	"sync"
)

// Locks is a set of mutexes by key. The zero value is ready.
type Locks struct {
	mu    sync.Mutex
	locks map[string]*entry
}

type entry struct {
	sync.Mutex
	refs int // holders and waiters
}

// Lock takes the keys' mutexes, each once, in sorted order (so two callers
// sharing keys cannot deadlock), and returns the unlock.
func (l *Locks) Lock(keys ...string) (unlock func()) {
	keys = append([]string(nil), keys...)
	sort.Strings(keys)
	var held []string
	for i, key := range keys {
		if i > 0 && keys[i-1] == key {
			continue
		}
		l.mu.Lock()
		if l.locks == nil {
			l.locks = map[string]*entry{}
		}
		e := l.locks[key]
		if e == nil {
			e = &entry{}
			l.locks[key] = e
		}
		e.refs++
		l.mu.Unlock()
		e.Lock()
		held = append(held, key)
	}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for i := len(held) - 1; i >= 0; i-- {
			e := l.locks[held[i]]
			e.Unlock()
			if e.refs--; e.refs == 0 {
				delete(l.locks, held[i])
			}
		}
	}
}

// Len is the number of keys locked or waited for.
func (l *Locks) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.locks)
}
