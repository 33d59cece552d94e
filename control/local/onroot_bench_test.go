package local

import (
	"context"
	"os"
	"testing"

	"github.com/nexus-sandbox/nexus/layout"
	"github.com/nexus-sandbox/nexus/lifecycle"
	"github.com/nexus-sandbox/nexus/store"
)

// BenchmarkOnRoot runs, in process, what a daemon does on the state root
// NEXUS_BENCH_ROOT names (one `nexus testfill` built): open the store as
// the daemon opens it, recover, and a reap dry run. For profiles
// (-cpuprofile, -memprofile) of one sub-benchmark at a time.
func BenchmarkOnRoot(b *testing.B) {
	root := os.Getenv("NEXUS_BENCH_ROOT")
	if root == "" {
		b.Skip("NEXUS_BENCH_ROOT names no state root")
	}
	ctx := context.Background()
	open := func() *store.Store {
		st, err := store.Open(ctx, root, store.Options{})
		if err != nil {
			b.Fatal(err)
		}
		return st
	}
	b.Run("open", func(b *testing.B) {
		for range b.N {
			if err := open().Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("recover", func(b *testing.B) {
		st := open()
		defer st.Close()
		m := &lifecycle.Manager{Root: layout.Root(root), B: Backend{st}}
		b.ResetTimer()
		for range b.N {
			if _, err := m.Recover(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reap", func(b *testing.B) {
		st := open()
		defer st.Close()
		m := &lifecycle.Manager{Root: layout.Root(root), B: Backend{st}}
		b.ResetTimer()
		for range b.N {
			if _, err := m.Reap(ctx, lifecycle.ReapOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
