// Package logtest holds a log sink for tests: a buffer that a logger's goroutines and the test
// may use at once.
package logtest

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent use; its zero value is ready. Give it to
// slog.NewTextHandler (or any writer) and read what was written with String or Count.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Count is how many times s occurs in what was written so far.
func (b *Buffer) Count(s string) int {
	return strings.Count(b.String(), s)
}
