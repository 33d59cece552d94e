package node

import "crypto/rand"

// cryptoReader feeds ULID entropy from the kernel's CSPRNG.
type cryptoReader struct{}

func (cryptoReader) Read(p []byte) (int, error) { return rand.Read(p) }
