// Package logbuf collects a logger's or a child process's output for a test
// that reads it while it is still being written.
package logbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer whose writes and reads may run at once. The zero
// value is empty and ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p. It never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
