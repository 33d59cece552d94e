//go:build nexustest && nexusd

package main

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"syscall"
)

// With NEXUS_TEST_HEAP_PROFILE=PREFIX, a test build of nexusd writes a
// heap profile to PREFIX.N (N counting from 1) each time it gets SIGUSR2,
// after a collection, so a benchmark can name what holds a daemon's
// memory between commands. A release build has no such handler.
func init() {
	prefix := os.Getenv("NEXUS_TEST_HEAP_PROFILE")
	if prefix == "" {
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR2)
	go func() {
		for n := 1; ; n++ {
			<-sig
			runtime.GC()
			f, err := os.Create(fmt.Sprintf("%s.%d", prefix, n))
			if err != nil {
				fmt.Fprintf(os.Stderr, "heap profile: %v\n", err)
				continue
			}
			if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
				fmt.Fprintf(os.Stderr, "heap profile: %v\n", err)
			}
			f.Close()
		}
	}()
}
