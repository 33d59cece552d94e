// Command guestfill runs inside a real guest for cmd/nexus's qemu tests
// (the initramfs has no shell or coreutils), copied in with `nexus cp`:
//
//	guestfill write PATH TEXT sync|nosync   write TEXT to PATH, fsynced or not
//	guestfill fill PATH                     write until ENOSPC, print the size
//	guestfill churn DIR                     write files without syncing, forever
//	guestfill statfs PATH                   print the bytes available
//	guestfill cat PATH                      print a file (/proc's too)
//
// Build it static: CGO_ENABLED=0.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "guestfill:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: guestfill write|fill|churn|statfs|cat PATH ...")
	}
	switch args[0] {
	case "write":
		if len(args) != 4 {
			return errors.New("usage: guestfill write PATH TEXT sync|nosync")
		}
		f, err := os.Create(args[1])
		if err != nil {
			return err
		}
		if _, err := f.WriteString(args[2]); err != nil {
			return err
		}
		if args[3] == "sync" {
			if err := f.Sync(); err != nil {
				return err
			}
			// The name too: a synced file is one a power cut keeps.
			if d, err := os.Open(filepath.Dir(args[1])); err == nil {
				d.Sync()
				d.Close()
			}
		}
		return f.Close()
	case "fill":
		f, err := os.Create(args[1])
		if err != nil {
			return err
		}
		buf := make([]byte, 1<<20)
		for i := range buf {
			buf[i] = byte(i * 7)
		}
		for {
			if _, err := f.Write(buf); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					return err
				}
				break
			}
		}
		f.Sync() // may itself say ENOSPC; the size is what was written
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		fmt.Println(fi.Size())
		return f.Close()
	case "churn":
		buf := make([]byte, 64<<10)
		for i := 0; ; i++ {
			p := filepath.Join(args[1], "churn-"+strconv.Itoa(i%64))
			if i == 1 {
				fmt.Println("churning") // the host waits for this line
			}
			if err := os.WriteFile(p, buf, 0o644); err != nil {
				return err
			}
		}
	case "cat":
		b, err := os.ReadFile(args[1])
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(b)
		return err
	case "statfs":
		var st syscall.Statfs_t
		if err := syscall.Statfs(args[1], &st); err != nil {
			return err
		}
		fmt.Println(st.Bavail * uint64(st.Bsize))
		return nil
	}
	return fmt.Errorf("unknown command %q", args[0])
}
