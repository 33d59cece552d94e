package fleet

import "time"

// MirrorChange is a state change of the mirror or its link, for the
// daemon to journal (as a mirror.<Kind> event). the Mirror only reports
// it; the daemon owns the append path.
type MirrorChange struct {
	// Kind is created, recreated, linked, unlinked, settings_differ or
	// refused.
	Kind     string
	Stream   string
	Domain   string
	Replicas int
	URLs     []string // without passwords
	// Detail is the settings kept (settings_differ) or the reason (refused).
	Detail string
	// Flaps: link changes since the previous link change that were not
	// reported on their own (linkQuiet).
	Flaps int
}

// mirrorChangeBuffer holds changes the daemon has not taken yet. A change
// that finds it full is dropped: reporting must never hold up mirroring,
// and with link changes limited a full buffer means no one is reading.
const mirrorChangeBuffer = 64

// Changes delivers the mirror's state changes (nil before Start).
func (m *Mirror) Changes() <-chan MirrorChange {
	if r := m.current(); r != nil {
		return r.changes
	}
	return nil
}

func (m *Mirror) reportChange(r *run, c MirrorChange) {
	c.Stream, c.Domain = m.StreamName(), m.Domain
	select {
	case r.changes <- c:
	default:
	}
}

// linkQuiet is the least time between two reported link changes, so a
// flapping link costs the journal one event per linkQuiet, not one per flap.
const linkQuiet = 10 * time.Second

// linkLimiter decides which link samples are reported: a change of the
// link from what was last reported, at most once per quiet; changes in
// between are counted into the next report.
type linkLimiter struct {
	quiet   time.Duration
	seen    bool // the link as last sampled
	told    bool // the link as last reported (down until the first report)
	toldAt  time.Time
	changes int // changes sampled since the last report
}

// observe takes one sample of the link; report says whether to report up
// now, with flaps the changes in between that were not reported.
func (l *linkLimiter) observe(now time.Time, up bool) (report bool, flaps int) {
	if up != l.seen {
		l.seen = up
		l.changes++
	}
	if up == l.told || (!l.toldAt.IsZero() && now.Sub(l.toldAt) < l.quiet) {
		return false, 0
	}
	flaps = l.changes - 1
	l.told, l.toldAt, l.changes = up, now, 0
	return true, flaps
}
