package events

import "time"

// Record is one journal event with its sequence.
type Record struct {
	Seq   uint64
	Event Event
}

// Query selects journal events. It lives beside the events (not in the store,
// which reads the journal) so a package that only asks for events, such as
// lifecycle, does not depend on the journal's implementation. Every bound
// is a position the journal seeks to, so a query reads only the events it
// returns.
type Query struct {
	Since     uint64    // first sequence (0 = from the start)
	SinceTime time.Time // if set, nothing stored before it
	Until     uint64    // last sequence (0 = no bound); not with Follow
	UntilTime time.Time // if set, nothing stored after it; not with Follow
	Sandbox   string    // sandbox ULID, "" = all
	Type      string    // full type, category, or "" = all
	Types     []string  // more types or categories: an event of any matches
	Tail      int       // only the last Tail events selected (0 = all)
	Follow    bool
}
