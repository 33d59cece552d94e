// Command benchbin is the few programs the agent benchmarks run in a real
// guest, whose initramfs holds nothing but the agent: one static binary
// that acts by the name it is called as.
//
//	true        exit 0
//	cat FILE    FILE to stdout
//	sink FILE   stdin to FILE, then fsync it (what cp's write promises)
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

func main() {
	var err error
	switch name := filepath.Base(os.Args[0]); name {
	case "true":
	case "cat":
		err = cat(os.Args[1])
	case "sink":
		err = sink(os.Args[1])
	default:
		err = fmt.Errorf("called as %q: want true, cat or sink", name)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func cat(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(os.Stdout, f)
	return err
}

func sink(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, os.Stdin); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
