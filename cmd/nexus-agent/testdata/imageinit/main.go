// Command imageinit stands for an image's own init in the PID 1 hand-over
// test: it records the pid it runs as, then does what an init must, reap
// every child it is given, forever.
package main

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	// Written aside and renamed into place: the test polls for the file
	// through the agent, and once read it empty between WriteFile's create
	// and its write (under load, the guest's one vCPU switched away).
	err := os.WriteFile("/etc/init-ran.tmp", fmt.Appendf(nil, "pid %d\n", os.Getpid()), 0o644)
	if err == nil {
		err = os.Rename("/etc/init-ran.tmp", "/etc/init-ran")
	}
	if err != nil {
		fmt.Println("imageinit:", err)
	}
	fmt.Println("imageinit: running as pid", os.Getpid())
	for {
		var ws unix.WaitStatus
		if _, err := unix.Wait4(-1, &ws, 0, nil); err != nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
}
