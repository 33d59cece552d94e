package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nexus-sandbox/nexus/events"
	"github.com/nexus-sandbox/nexus/host/fleet"
	"github.com/nexus-sandbox/nexus/store"
)

// mirrorEvent is the journal's record of a mirror change (false for a
// kind this build does not journal).
func mirrorEvent(c fleet.MirrorChange, at time.Time) (events.Event, bool) {
	var p events.Payload
	switch c.Kind {
	case "created":
		p = events.MirrorCreatedEvent{Stream: c.Stream, Domain: c.Domain, Replicas: c.Replicas}
	case "recreated":
		p = events.MirrorRecreatedEvent{Stream: c.Stream, Domain: c.Domain, Replicas: c.Replicas}
	case "linked":
		p = events.MirrorLinkedEvent{Stream: c.Stream, URLs: c.URLs, Flaps: c.Flaps}
	case "unlinked":
		p = events.MirrorUnlinkedEvent{Stream: c.Stream, URLs: c.URLs, Flaps: c.Flaps}
	case "settings_differ":
		p = events.MirrorSettingsDifferEvent{Stream: c.Stream, Kept: c.Detail}
	case "refused":
		p = events.MirrorRefusedEvent{Stream: c.Stream, Reason: c.Detail}
	default:
		return events.Event{}, false
	}
	return events.New(ulid.Make(), at, "", p), true
}

// journalMirror appends a mirror.* event for each change the journal
// reports, through the store's append path, until stopped. The journal
// never waits for it (its feed drops rather than blocks), and the local
// append does not depend on the fleet, so a fleet that is down holds up
// nothing. The returned function stops it and waits for it.
func journalMirror(ctx context.Context, n *store.Store, m *fleet.Mirror) (stop func()) {
	if m == nil {
		return func() {}
	}
	changes := m.Changes()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case c := <-changes:
				e, ok := mirrorEvent(c, time.Now())
				if !ok {
					continue
				}
				actx, acancel := context.WithTimeout(ctx, 30*time.Second)
				if _, err := n.Append(actx, e); err != nil && ctx.Err() == nil {
					slog.Warn(fmt.Sprintf("journal %s: %v", e.Type, err), "component", "mirror")
				}
				acancel()
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
