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
	if err := os.WriteFile("/etc/init-ran", fmt.Appendf(nil, "pid %d\n", os.Getpid()), 0o644); err != nil {
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
