package testutil

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe to read while another goroutine writes
// it, such as a child's stdout or stderr that os/exec copies in from a
// goroutine of its own while the test reads what has arrived so far.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is what has been written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Len is how many bytes have been written so far.
func (b *Buffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Len()
}
