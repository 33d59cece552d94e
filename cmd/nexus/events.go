package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/client"
	"github.com/nexus-sandbox/nexus/control"
	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/session"
)

// parsePosition reads a journal position: a sequence (digits only), an
// RFC 3339 time, or an age before now (10m, 36h, 7d, 1d12h).
func parsePosition(flag, s string, now time.Time) (uint64, time.Time, error) {
	if s == "" {
		return 0, time.Time{}, nil
	}
	if strings.Trim(s, "0123456789") == "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, time.Time{}, fmt.Errorf("%s %q: sequence out of range", flag, s)
		}
		return n, time.Time{}, nil
	}
	if t, ok := parseWhen(s, now); ok {
		return 0, t, nil
	}
	return 0, time.Time{}, fmt.Errorf("%s %q: want a sequence (42), an RFC 3339 time (2026-01-02T15:04:05Z) or an age (10m, 36h, 7d)", flag, s)
}

// parseWhen reads a point in time as an RFC 3339 time or an age before
// now.
func parseWhen(s string, now time.Time) (time.Time, bool) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, true
	}
	if d, err := parseAge(s); err == nil {
		return now.Add(-d), true
	}
	return time.Time{}, false
}

// eventsQuery fills q from the flags; every error is a usage error.
func eventsQuery(q *events.Query, since, until string, now time.Time) error {
	var err error
	if q.Since, q.SinceTime, err = parsePosition("--since", since, now); err != nil {
		return err
	}
	if q.Until, q.UntilTime, err = parsePosition("--until", until, now); err != nil {
		return err
	}
	if q.Follow && until != "" {
		return errors.New("--until and --follow exclude each other: a follow has no end")
	}
	if q.Tail < 0 {
		return fmt.Errorf("--tail %d: want a count of events", q.Tail)
	}
	_, err = events.FilterSubjects(q.Types, "")
	return err
}

// resolveEventSandbox turns a handle into its sandbox's id: the live
// sandbox's, else the newest removed one's. A ULID is taken as is, so the
// events of a removed sandbox stay reachable by id.
func resolveEventSandbox(ctx context.Context, b control.Backend, q *events.Query) error {
	if q.Sandbox == "" {
		return nil
	}
	if id, err := ulid.ParseStrict(q.Sandbox); err == nil {
		q.Sandbox = id.String()
		return nil
	}
	sb, err := session.Lookup(ctx, b, q.Sandbox)
	if errors.Is(err, client.ErrNotFound) {
		// A removed sandbox's handle: the newest sandbox that claimed it.
		claimed := ""
		if cerr := b.Events(ctx, events.Query{Type: string(events.HandleClaimed)}, func(r events.Record) error {
			if p, ok := r.Event.Payload.(events.HandleClaimedEvent); ok && p.Handle == q.Sandbox {
				claimed = p.Sandbox
			}
			return nil
		}); cerr != nil {
			return cerr
		}
		if claimed != "" {
			q.Sandbox = claimed
			return nil
		}
	}
	if err != nil {
		return err
	}
	q.Sandbox = sb.ID
	return nil
}
