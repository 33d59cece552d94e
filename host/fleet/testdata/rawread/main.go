// Command rawread reads the first n records of a stream through one
// ordered consumer and prints the bytes of data it read: a raw reader
// that, like `nexus fleet events`, starts its own process and makes its
// own connection, for the fleet benchmark's second baseline.
//
// Usage: rawread URL STREAM N
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	if err := read(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "rawread:", err)
		os.Exit(1)
	}
}

func read(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("usage: rawread URL STREAM N")
	}
	n, err := strconv.Atoi(args[2])
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	nc, err := nats.Connect(args[0], nats.Timeout(15*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	s, err := js.Stream(ctx, args[1])
	if err != nil {
		return err
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	it, err := oc.Messages(jetstream.PullMaxMessages(1024))
	if err != nil {
		return err
	}
	defer it.Stop()
	size := 0
	for range n {
		m, err := it.Next()
		if err != nil {
			return err
		}
		size += len(m.Data())
	}
	fmt.Println(size)
	return nil
}
