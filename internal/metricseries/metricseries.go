// Package metricseries keeps the Prometheus series a hot path records in, each looked up in its
// vector once: a vector's lookup (WithLabelValues) hashes the labels and searches under a lock,
// and a job's some 28 lookups were ~3% of its instructions (issue 23, docs/benchmarks.md). A
// series is made on its first use, where the lookup used to be made, so a process exports the
// same series as with a lookup per use; the vectors keep every series anyway, so holding them
// grows nothing new.
//
// Map holds series by a label value (a credential's name, a status code), Lazy one series (a
// stage's, one of a credential's). Both are ready at their zero value, safe for concurrent use,
// make each series once, and take no lock once it is made.
package metricseries

import (
	"maps"
	"sync"
	"sync/atomic"
)

// Map is a set of series by key, each made on its key's first Get and kept. It is meant for a
// bounded set of keys (label values from the configuration or the code): a Get of a new key
// copies the set. Its zero value is empty and ready; it must not be copied after first use.
type Map[K comparable, V any] struct {
	byKey atomic.Pointer[map[K]V] // never changed once stored: a new key stores a copy
	mu    sync.Mutex              // held by the Get that adds a key
}

// Get returns key's series, made with mk(key) on the first Get of key. Concurrent first Gets of
// a key call mk once (under a lock of m's, so mk must not use m) and return what it made; a Get
// of a key already made reads it without a lock and allocates nothing.
func (m *Map[K, V]) Get(key K, mk func(K) V) V {
	if p := m.byKey.Load(); p != nil {
		if v, ok := (*p)[key]; ok {
			return v
		}
	}
	return m.add(key, mk)
}

// Load returns key's series and true when a Get has made it; the zero V and false otherwise.
// It makes nothing, takes no lock and allocates nothing.
func (m *Map[K, V]) Load(key K) (V, bool) {
	if p := m.byKey.Load(); p != nil {
		v, ok := (*p)[key]
		return v, ok
	}
	var zero V
	return zero, false
}

// add makes key's series with mk unless a Get racing this one has, and stores the set with it.
func (m *Map[K, V]) add(key K, mk func(K) V) V {
	m.mu.Lock()
	defer m.mu.Unlock()
	byKey := map[K]V{}
	if old := m.byKey.Load(); old != nil {
		if v, ok := (*old)[key]; ok {
			return v
		}
		byKey = maps.Clone(*old)
	}
	v := mk(key)
	byKey[key] = v
	m.byKey.Store(&byKey)
	return v
}

// Lazy is one series, made on the first Get and kept. Its zero value is ready; it must not be
// copied after first use.
type Lazy[T any] struct {
	made atomic.Bool // v is set: stored after v, under mu
	mu   sync.Mutex  // held by the Get that makes v
	v    T
}

// Get returns the series, made with mk on the first Get. Concurrent first Gets call mk once (under
// a lock of l's, so mk must not use l) and all return what it made; a Get after it takes no lock
// and allocates nothing.
func (l *Lazy[T]) Get(mk func() T) T {
	if l.made.Load() {
		return l.v
	}
	return l.make(mk)
}

// make makes the series with mk unless a Get racing this one has.
func (l *Lazy[T]) make(mk func() T) T {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.made.Load() {
		l.v = mk()
		l.made.Store(true)
	}
	return l.v
}
