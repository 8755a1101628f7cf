// Package keyedlock is one mutex per key (a claim, a GPU, a PF), created on
// demand, so that work on different devices runs concurrently.
package keyedlock

import (
	"sort"
	"sync"
)

// Locks is a set of mutexes by key. The zero value is ready.
type Locks struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// Lock takes the keys' mutexes, each once, in sorted order (so two callers
// sharing keys cannot deadlock), and returns the unlock.
func (l *Locks) Lock(keys ...string) (unlock func()) {
	keys = append([]string(nil), keys...)
	sort.Strings(keys)
	var held []*sync.Mutex
	for i, key := range keys {
		if i > 0 && keys[i-1] == key {
			continue
		}
		l.mu.Lock()
		if l.locks == nil {
			l.locks = map[string]*sync.Mutex{}
		}
		m, ok := l.locks[key]
		if !ok {
			m = &sync.Mutex{}
			l.locks[key] = m
		}
		l.mu.Unlock()
		m.Lock()
		held = append(held, m)
	}
	return func() {
		for i := len(held) - 1; i >= 0; i-- {
			held[i].Unlock()
		}
	}
}
