package journal

import "github.com/nats-io/nats.go/jetstream"

// StreamForBench is the journal's stream, for benchmarks that compare
// nexus's reads with a raw consumer over the same stream.
func (j *Journal) StreamForBench() jetstream.Stream { return j.currentStream() }
