// Package logtest holds a log sink for tests that read what goroutines
// under test log.
package logtest

import (
	"bytes"
	"sync"
)

// Buffer is a log sink the code under test may write to from any goroutine
// while the test reads it.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

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
