package ledger

import (
	"errors"
	"time"
)

// UnparseableGrace is how long an unparseable run is left alone: it may be
// mid-write by its own process.
const UnparseableGrace = time.Hour

// StartTolerance is how far a recorded start time may be from the live
// process's and still name it. Start times are derived from the boot time,
// which /proc/stat gives in whole seconds, so writers in other languages may
// round differently.
const StartTolerance = 2 * time.Second

// Verdict is what a sweep does with a run.
type Verdict string

const (
	Keep  Verdict = "keep"
	Sweep Verdict = "sweep"
)

// Why a run was kept or swept; these strings are journaled and documented.
const (
	ReasonSelf             = "own run"
	ReasonUnparseableYoung = "unparseable, younger than an hour (may be mid-write)"
	ReasonUnparseableOld   = "unparseable, older than an hour"
	ReasonSchemaTooNew     = "written by a newer schema"
	ReasonOtherDriver      = "another driver's run"
	ReasonOwnerAlive       = "owner alive (pid and start time match)"
	ReasonOwnerLocked      = "owner alive (holds its record's liveness lock)"
	ReasonOwnerGone        = "owner gone"
	ReasonPidReused        = "pid reused by another process (start time differs)"
	ReasonWatchdog         = "owner closed its watchdog pipe"
)

// Owner is what /proc said about a record's pid.
type Owner struct {
	Running     bool  // a process (not a zombie) has the pid
	StartTimeMs int64 // its start, Unix ms, when Running
}

// Observation is everything a decision depends on, gathered by the edge.
type Observation struct {
	Run      string
	Record   Record // valid when ParseErr is nil
	ParseErr error  // the record (or a list) did not parse, or is missing
	Age      time.Duration
	Owner    Owner // read only for parsed records of our driver
	// Locked: a live process holds a POSIX or OFD lock on the record (see
	// docs/ledger.md, "The liveness lock"). Locks die with their holder,
	// so this is proof of life that pid reuse cannot fake.
	Locked bool
}

// Self is the sweeping process.
type Self struct {
	Run    string // its own run id, never swept by itself ("" for none)
	Driver string
}

// Decision is a verdict with the rule that produced it.
type Decision struct {
	Verdict Verdict
	Reason  string
}

// NeedsOwner reports whether Decide will look at o.Owner, so the edge reads
// /proc only for those runs.
func NeedsOwner(o Observation, self Self) bool {
	return o.Run != self.Run && !o.Locked && o.ParseErr == nil && o.Record.Driver == self.Driver
}

// Decide is the sweep rule of the ledger, in order: own run keep; record
// locked by a live process keep (whatever it says: its writer lives);
// unparseable keep under an hour, sweep after; newer schema keep; other
// driver keep; pid + start time (within StartTolerance) of a running
// process keep; else sweep.
func Decide(o Observation, self Self) Decision {
	switch {
	case o.Run == self.Run:
		return Decision{Keep, ReasonSelf}
	case o.Locked:
		return Decision{Keep, ReasonOwnerLocked}
	case errors.Is(o.ParseErr, ErrSchemaTooNew):
		return Decision{Keep, ReasonSchemaTooNew}
	case o.ParseErr != nil && o.Age < UnparseableGrace:
		return Decision{Keep, ReasonUnparseableYoung}
	case o.ParseErr != nil:
		return Decision{Sweep, ReasonUnparseableOld}
	case o.Record.Driver != self.Driver:
		return Decision{Keep, ReasonOtherDriver}
	case !o.Owner.Running:
		return Decision{Sweep, ReasonOwnerGone}
	}
	d := o.Owner.StartTimeMs - o.Record.StartTimeMs
	if d < 0 {
		d = -d
	}
	if time.Duration(d)*time.Millisecond <= StartTolerance {
		return Decision{Keep, ReasonOwnerAlive}
	}
	return Decision{Sweep, ReasonPidReused}
}

// Mode is the NEXUS_REAPER switch.
type Mode string

const (
	ModeOn    Mode = "on"    // sweep and watchdog
	ModeSweep Mode = "sweep" // sweep only
	ModeOff   Mode = "off"   // neither (the ledger is still written)
)

// ParseMode reads NEXUS_REAPER; anything unrecognised (empty included) is on,
// so a typo never disables crash cleanup.
func ParseMode(s string) Mode {
	switch Mode(s) {
	case ModeSweep, ModeOff:
		return Mode(s)
	}
	return ModeOn
}

// Sweeps reports whether the init-time sweep runs in this mode.
func (m Mode) Sweeps() bool { return m != ModeOff }

// Watches reports whether a watchdog is spawned in this mode.
func (m Mode) Watches() bool { return m == ModeOn }
