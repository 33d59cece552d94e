// Package testhooks is the failure injection of a nexus binary built with
// -tags nexustest, which is what the tests build: saga hooks that SIGKILL
// or SIGSTOP the process at a step (NEXUS_CRASH_AT, NEXUS_PAUSE_AT),
// appends that fail before reaching the journal (NEXUS_FAIL_APPEND), and a
// simulated lifecycle journaled without a VM. A release binary does not
// link it, so it neither reads those variables nor journals made-up
// events.
package testhooks

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/core"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/sagas"
)

// atStep matches a saga hook's arguments against <saga>.<step> (after the
// step's events are journaled) or <saga>.<step>:before (after its effect,
// before its events); "" matches nothing and gives nil.
func atStep(at string) func(kind, step string, p sagas.Phase) bool {
	if at == "" {
		return nil
	}
	// <saga>.<step>[:before][#N]: #N matches the N-th time only (a fork's
	// second child runs the same steps as its first).
	nth := 1
	if i := strings.LastIndexByte(at, '#'); i > 0 {
		if n, err := strconv.Atoi(at[i+1:]); err == nil && n > 0 {
			at, nth = at[:i], n
		}
	}
	want, phase := at, sagas.AfterRecord
	if w, ok := strings.CutSuffix(at, ":before"); ok {
		want, phase = w, sagas.BeforeRecord
	}
	var seen atomic.Int32
	return func(kind, step string, p sagas.Phase) bool {
		return kind+"."+step == want && p == phase && int(seen.Add(1)) == nth
	}
}

// crashHook kills this process with SIGKILL at one saga step, for the crash
// tests: NEXUS_CRASH_AT=<saga>.<step>[:before].
func crashHook(at string) func(kind, step string, phase sagas.Phase) {
	match := atStep(at)
	if match == nil {
		return nil
	}
	return func(kind, step string, p sagas.Phase) {
		if match(kind, step, p) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
}

// SagaHooks are the saga hooks the tests drive through the environment:
// NEXUS_CRASH_AT kills the process at a step, NEXUS_PAUSE_AT stops it there
// (SIGSTOP, after saying so on stderr) until it is sent SIGCONT, so a test
// can look at the state root with a real creator frozen mid-flight.
func SagaHooks() func(kind, step string, phase sagas.Phase) {
	crash := crashHook(os.Getenv("NEXUS_CRASH_AT"))
	pause := pauseHook(os.Getenv("NEXUS_PAUSE_AT"))
	if crash == nil || pause == nil {
		if crash != nil {
			return crash
		}
		return pause
	}
	return func(kind, step string, p sagas.Phase) {
		crash(kind, step, p)
		pause(kind, step, p)
	}
}

// pauseHook stops this process (SIGSTOP, after saying so on stderr) at one
// saga step until it is sent SIGCONT: NEXUS_PAUSE_AT=<saga>.<step>[:before].
func pauseHook(at string) func(kind, step string, phase sagas.Phase) {
	match := atStep(at)
	if match == nil {
		return nil
	}
	return func(kind, step string, p sagas.Phase) {
		if match(kind, step, p) {
			pauseHere(at)
		}
	}
}

// spawnLockPause is NEXUS_PAUSE_AT=daemon.spawn-lock: the command stops
// with the daemon spawn lock just taken, as one a user stopped with Ctrl-Z
// at that instant would.
const spawnLockPause = "daemon.spawn-lock"

// SpawnLock is the hook control.AutoStart runs with the daemon spawn lock
// just taken: NEXUS_PAUSE_AT=daemon.spawn-lock pauses there (nil: none).
func SpawnLock() func() {
	if os.Getenv("NEXUS_PAUSE_AT") != spawnLockPause {
		return nil
	}
	return func() { pauseHere(spawnLockPause) }
}

// ensuredPause is NEXUS_PAUSE_AT=daemon.ensured: the command stops once
// it has seen the root's daemon answer, before it dials it.
const ensuredPause = "daemon.ensured"

// Ensured is the hook control.AutoStart runs once a daemon answers for
// the command, before it dials it: NEXUS_PAUSE_AT=daemon.ensured pauses
// there (nil: none).
func Ensured() func() {
	if os.Getenv("NEXUS_PAUSE_AT") != ensuredPause {
		return nil
	}
	var once sync.Once // a command handed to a successor passes here again
	return func() { once.Do(func() { pauseHere(ensuredPause) }) }
}

// earlyOpenHold is NEXUS_PAUSE_AT=daemon.early-open: a daemon answering
// the sandbox store's reads early holds its journal's open there.
const earlyOpenHold = "daemon.early-open"

// EarlyOpen is the hook a daemon runs before the journal's open behind
// its early reads: NEXUS_PAUSE_AT=daemon.early-open holds the open there,
// after saying so on stderr, until the daemon is sent SIGCONT; the daemon
// is not stopped, and goes on answering the early reads (nil: none).
func EarlyOpen() func() {
	if os.Getenv("NEXUS_PAUSE_AT") != earlyOpenHold {
		return nil
	}
	return func() {
		cont := make(chan os.Signal, 1)
		signal.Notify(cont, syscall.SIGCONT)
		defer signal.Stop(cont)
		fmt.Fprintf(os.Stderr, "nexus: holding the journal's open at %s (pid %d)\n", earlyOpenHold, os.Getpid())
		<-cont
	}
}

// pauseHere says so on stderr, then stops this process until SIGCONT.
func pauseHere(at string) {
	// A self-sent SIGSTOP may take effect a little after kill(2) returns;
	// waiting for the SIGCONT itself makes the pause exact.
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	defer signal.Stop(cont)
	term := make(chan os.Signal, 1)
	signal.Notify(term, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(term)
	fmt.Fprintf(os.Stderr, "nexus: paused at %s (pid %d)\n", at, os.Getpid())
	syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	<-cont
	// A SIGINT or SIGTERM sent while the command was stopped is handed
	// over before the SIGCONT (the kernel and os/signal both take the lower
	// number first), but the command cancels its context on a goroutine of
	// its own. The flow waits for that, as if the signal had come between
	// two steps, instead of racing it to its next step.
	select {
	case <-term:
		if interrupt != nil {
			select {
			case <-interrupt.Done():
			case <-time.After(time.Minute):
			}
		}
	default:
	}
}

// interrupt is the command's context, which its first SIGINT or SIGTERM
// cancels (WatchInterrupt).
var interrupt context.Context

// WatchInterrupt gives the pause hook the command's context, cancelled by
// its first SIGINT or SIGTERM, so that a signal sent to a paused command
// is handled before its flow goes on.
func WatchInterrupt(ctx context.Context) { interrupt = ctx }

// FailAppends wraps b for the failure-injection tests: with
// NEXUS_FAIL_APPEND=<event type> set, every append carrying an event of that
// type fails before reaching the journal, as a journal write error would.
func FailAppends(b control.Backend) control.Backend {
	t := os.Getenv("NEXUS_FAIL_APPEND")
	if t == "" {
		return b
	}
	return failingBackend{Backend: b, fail: events.Type(t)}
}

type failingBackend struct {
	control.Backend
	fail events.Type
}

func (f failingBackend) Append(ctx context.Context, evs ...events.Event) ([]uint64, error) {
	return f.AppendExpect(ctx, nil, evs...)
}

func (f failingBackend) AppendExpect(ctx context.Context, expect []core.Expect, evs ...events.Event) ([]uint64, error) {
	for _, e := range evs {
		if e.Type == f.fail {
			return nil, fmt.Errorf("injected failure appending %s (NEXUS_FAIL_APPEND)", f.fail)
		}
	}
	return f.Backend.AppendExpect(ctx, expect, evs...)
}

// Demo journals the events of one simulated sandbox lifecycle (create,
// then rm) through the real saga runner and j. It creates no VM and no
// disk, and returns the simulated sandbox's id.
func Demo(ctx context.Context, j sagas.Journal) (string, error) {
	id := ulid.Make().String()
	res := func(kind events.ResourceKind, path string) events.Resource {
		return events.Resource{Kind: kind, Path: path}
	}
	intent := res(events.KindCreateIntent, "disks/"+id+".create-intent.json")
	raw := res(events.KindRawDisk, "disks/"+id+".raw")
	emit := func(p events.Payload) func(context.Context) ([]events.Payload, error) {
		return func(context.Context) ([]events.Payload, error) { return sagas.One(p), nil }
	}
	create := &sagas.Saga{Kind: events.SagaCreate, Sandbox: id, Steps: []sagas.Step{
		{Name: "intent", Do: emit(events.IntentWrittenEvent{Resource: intent, Covers: []string{raw.Path}})},
		{Name: "os-disk", Do: emit(events.DiskMaterialisedEvent{Resource: raw, Method: "simulated"})},
		{Name: "commit", Do: emit(events.SandboxCreatedEvent{Handle: "demo-" + id[20:], Image: "demo.raw", Driver: "process", Resources: []events.Resource{raw}})},
		{Name: "retire-intent", Do: emit(events.IntentRetiredEvent{Resource: intent})},
	}}
	if err := create.Run(ctx, j); err != nil {
		return "", err
	}
	remove := &sagas.Saga{Kind: events.SagaRm, Sandbox: id, Steps: []sagas.Step{
		{Name: "reclaim-os-disk", Do: emit(events.ResourceReclaimedEvent{Resource: raw, By: "rm"})},
		{Name: "remove", Do: emit(events.SandboxRemovedEvent{})},
	}}
	return id, remove.Run(ctx, j)
}
