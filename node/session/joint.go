package session

import "sync/atomic"

// Joint is the completion of one write's entries on their way to several
// peers, counted as they complete: the last to complete closes Done. A
// writer that waits for every peer's ack (protocol C) waits on Done and
// wakes once, when the last ack is counted, instead of once per peer as
// it looks at each entry's Done in turn (issue 31: a third replica costs
// its peer's share only).
//
// The writer arms it before it hands any entry over, adds each entry it
// hands a session (Pending.Joint), releases each one the session did not
// take, and releases its own hold once every peer was offered the entry
// (Seal). Whoever completes an entry (its session's loop) releases it.
// The zero Joint is unarmed: nothing waits on it.
type Joint struct {
	n    atomic.Int32
	done chan struct{}
}

// Arm readies j for a write's entries; the writer holds it until Seal.
// Only the writer calls it, before it hands the first entry over.
func (j *Joint) Arm() {
	j.n.Store(1)
	j.done = make(chan struct{})
}

// Armed reports whether the writer armed j.
func (j *Joint) Armed() bool { return j.done != nil }

// Add counts an entry the writer is about to hand a session, with
// Pending.Joint set to j.
func (j *Joint) Add() { j.n.Add(1) }

// Release takes back one entry counted by Add: it completed, or the
// session did not take it.
func (j *Joint) Release() {
	if j.n.Add(-1) == 0 {
		close(j.done)
	}
}

// Seal releases the writer's own hold: every peer was offered the entry.
func (j *Joint) Seal() { j.Release() }

// Done is closed once every entry counted has completed and the writer
// sealed j. Each entry's own Done, acked and error are then settled.
func (j *Joint) Done() <-chan struct{} { return j.done }
