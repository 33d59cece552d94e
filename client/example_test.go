package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/nexus-sandbox/nexus/client"
)

// A program creates a sandbox bound to its own process, runs a command in
// it, copies a file in and back out, snapshots it, lists it and removes
// it. nexus and nexusd are on PATH;
// with the process driver the "guest" is the host.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "nx")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, "root") // nexus's own; the image is outside it
	img := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		log.Fatal(err)
	}

	c, err := client.New(client.Options{StateDir: root, Driver: "process"})
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.Create(ctx, client.CreateSpec{Image: img, Handle: "demo"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sb.Handle, sb.State, sb.Ready)

	st, err := c.Exec(ctx, "demo", client.ExecOptions{Argv: []string{"echo", "hello from the guest"}, Stdout: os.Stdout})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit", st.Code)

	if _, err := c.CopyIn(ctx, "demo", "/workspace/note.txt", strings.NewReader("copied in\n")); err != nil {
		log.Fatal(err)
	}
	if _, err := c.CopyOut(ctx, "demo", "/workspace/note.txt", os.Stdout); err != nil {
		log.Fatal(err)
	}

	if _, err := c.Snapshot(ctx, "demo"); err != nil {
		log.Fatal(err)
	}
	list, err := c.List(ctx, client.ListOptions{Filters: []string{"handle=demo"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(list), "sandbox,", len(list[0].Snapshots), "snapshot")

	if err := c.Remove(ctx, "demo"); err != nil {
		log.Fatal(err)
	}
	list, err = c.List(ctx, client.ListOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(list), "sandboxes after remove")

	// Close removes what this run still lists (nothing here); the daemon
	// started on demand would idle out by itself.
	if err := c.Close(ctx); err != nil {
		log.Fatal(err)
	}
	if err := c.StopDaemon(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// demo running true
	// hello from the guest
	// exit 0
	// copied in
	// 1 sandbox, 1 snapshot
	// 0 sandboxes after remove
}
