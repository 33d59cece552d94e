package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// Exit codes come from an error's type, never its text: an operational
// error that happens to read "unknown command" is still exit 1, and a
// command's chosen status passes through wrapping untouched.
func TestExitCodeFromTypes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, 0},
		{"operational", errors.New("journal append failed"), 1},
		{"text that looks like usage", errors.New("unknown command \"x\" from the guest agent"), 1},
		{"usage", usageError{errors.New("bad flag")}, 2},
		{"wrapped usage", fmt.Errorf("ctx: %w", usageError{errors.New("bad flag")}), 2},
		{"run's child status", exitStatus{7}, 7},
		{"wrapped child status", fmt.Errorf("run: %w", exitStatus{143}), 143},
	} {
		if got := exitCode(c.err); got != c.want {
			t.Errorf("%s: exitCode(%v) = %d, want %d", c.name, c.err, got, c.want)
		}
	}
}

// An unknown command is typed as a usage error by looking the command line
// up before it runs, flags before it included; a known one is not.
func TestExecuteTypesUnknownCommand(t *testing.T) {
	t.Parallel()
	var u usageError
	err := execute(context.Background(), newRoot(), []string{"--state-dir", t.TempDir(), "frobnicate"})
	if !errors.As(err, &u) {
		t.Fatalf("unknown command: %v (%T), want a usageError", err, err)
	}
	if err := execute(context.Background(), newRoot(), []string{"version"}); err != nil {
		t.Fatalf("version: %v", err)
	}
}
