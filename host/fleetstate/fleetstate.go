// Package fleetstate is the state of a host's fleet mirror as its daemon
// reports it: a plain record, so a command prints it without linking the
// fleet adapter (host/fleet) that keeps the mirror.
package fleetstate

import (
	"fmt"
	"strings"
)

// AggregateStream is the fleet's aggregate: one stream in the auditors'
// account sourced from every host's mirror, so the fleet reads as one
// journal. No host name maps to it: a mirror's stream name never has a '-'.
const AggregateStream = "NEXUS-FLEET"

// MirrorStream is the fleet stream a valid host name mirrors into: the
// journal's stream name (NEXUS), '_', the name in upper case with '_' for
// '-'. It is injective over valid names, which hold no '_' and no upper
// case.
func MirrorStream(host string) string {
	return "NEXUS_" + strings.ToUpper(strings.ReplaceAll(host, "-", "_"))
}

// HostOfMirror is the host whose mirror stream is named stream, the
// inverse of MirrorStream; false for a name no host mirrors into.
func HostOfMirror(stream string) (string, bool) {
	rest, ok := strings.CutPrefix(stream, "NEXUS_")
	if !ok || rest == "" {
		return "", false
	}
	host := strings.ReplaceAll(strings.ToLower(rest), "_", "-")
	return host, MirrorStream(host) == stream
}

// AuditAPIPrefix is the JetStream API prefix auditors use
// (jetstream.NewWithAPIPrefix, natscli --js-api-prefix). The imports land
// there, not on $JS.API, where the audit account's own JetStream would
// answer the same request first.
const AuditAPIPrefix = "$NEXUS.AUDIT.API"

// MirrorState is the mirror as the host sees it now: the link, the
// stream on the fleet, and how far the fleet's copy trails the journal.
type MirrorState struct {
	Host      string   `json:"host"`
	HostID    string   `json:"host_id"`
	Stream    string   `json:"stream"`
	Domain    string   `json:"domain"`
	URLs      []string `json:"urls"` // without passwords
	Connected bool     `json:"connected"`
	// LinkedNode and LinkedAddr are the fleet node the link is up to now:
	// its server name and the address it was reached at ("" while down).
	LinkedNode string `json:"linked_node,omitempty"`
	LinkedAddr string `json:"linked_addr,omitempty"`
	// Exists: the fleet answered and holds the mirror.
	Exists   bool `json:"exists"`
	Replicas int  `json:"replicas,omitempty"`
	// JournalLastSeq and MirrorLastSeq are the last sequence of each; the
	// mirror keeps the journal's sequences, so LagEvents is their
	// difference, plus MissingEvents.
	JournalLastSeq uint64 `json:"journal_last_seq"`
	MirrorLastSeq  uint64 `json:"mirror_last_seq"`
	LagEvents      uint64 `json:"lag_events"`
	// MirrorFirstSeq and MirrorMsgs: where the mirror starts and how many
	// records it holds; MissingEvents is how many of the journal's records
	// up to MirrorLastSeq it lacks (a head cut off, a gap), which the lag
	// counts too.
	MirrorFirstSeq uint64 `json:"mirror_first_seq"`
	MirrorMsgs     uint64 `json:"mirror_msgs"`
	MissingEvents  uint64 `json:"missing_events"`
	// ReportedSeq is the journal's last sequence as this host last
	// published it to its report stream (ReportStream), which `replay`
	// holds the mirror to (0: not yet).
	ReportedSeq uint64 `json:"reported_seq"`
	// LagSeconds is how much older the mirror's newest event is than the
	// journal's (0 when current).
	LagSeconds float64 `json:"lag_seconds"`
	// LastError is the fleet's or the link's last complaint, "" if none.
	LastError string `json:"last_error,omitempty"`
	// Drift lists settings an operator changed on the fleet that nexus keeps.
	Drift string `json:"drift,omitempty"`
	// DigestSeq is the host's last journaled digest (journal.digest) the
	// mirror was checked against (0: none yet, or not mirrored that far).
	DigestSeq uint64 `json:"digest_seq"`
	// FailedChecks are the checks the mirror failed against the journal:
	// first sequence, count, last sequence, digest. None: it is a true
	// copy of the journal as far as it goes.
	FailedChecks []FailedCheck `json:"failed_checks"`
}

// FailedCheck is one check a mirror failed, and what each side holds.
type FailedCheck struct {
	Check  string `json:"check"`
	Detail string `json:"detail"`
}

func (f FailedCheck) String() string { return f.Check + " check failed: " + f.Detail }

// Rejected is a record a reader skipped and reports: one that does not
// match the stream it was read from (another host's subject, no or a
// wrong source, a sequence not its host's, undecodable data).
type Rejected struct {
	Stream  string `json:"stream"`
	Seq     uint64 `json:"seq"` // in Stream
	Subject string `json:"subject"`
	Reason  string `json:"reason"`
}

func (r Rejected) String() string {
	if r.Subject == "" {
		return fmt.Sprintf("%s sequence %d: %s", r.Stream, r.Seq, r.Reason)
	}
	return fmt.Sprintf("%s sequence %d (%s): %s", r.Stream, r.Seq, r.Subject, r.Reason)
}
