// Command orphan leaves an orphan behind for the PID 1 test: it starts a
// copy of itself that outlives it, prints that copy's pid and exits, so
// the copy is reparented to PID 1 and exits a moment later.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "child" {
		time.Sleep(300 * time.Millisecond)
		return
	}
	c := exec.Command(os.Args[0], "child")
	if err := c.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(c.Process.Pid)
}
