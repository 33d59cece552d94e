package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// daemonLogger is the daemon's structured log: key=value text for a person
// at a terminal, one JSON object per line for anything else (a log file, a
// service manager's journal). NEXUS_LOG_LEVEL (debug, info, warn, error)
// sets the threshold; debug includes the embedded NATS server's notices.
func daemonLogger(w io.Writer) (*slog.Logger, error) {
	level := slog.LevelInfo
	if s := os.Getenv("NEXUS_LOG_LEVEL"); s != "" {
		if err := level.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
			return nil, usageError{fmt.Errorf("NEXUS_LOG_LEVEL %q: want debug, info, warn or error", s)}
		}
	}
	opts := &slog.HandlerOptions{Level: level}
	if isTerminal(w) {
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return slog.New(slog.NewJSONHandler(w, opts)), nil
}
