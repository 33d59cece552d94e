package events

// Record is one journal event with its sequence.
type Record struct {
	Seq   uint64
	Event Event
}

// Query selects journal events. It lives beside the events (not in node,
// which reads the journal) so a package that only asks for events, such as
// lifecycle, does not depend on the journal's implementation.
type Query struct {
	Since   uint64 // first sequence (0 = from the start)
	Sandbox string // "" = all
	Type    string // full type, category, or "" = all
	Follow  bool
}
