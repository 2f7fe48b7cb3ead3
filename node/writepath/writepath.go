package writepath

// Stage is what the runner of a write does next.
type Stage uint8

const (
	// Log: the write's extent enters the activity log, durably. Reported
	// with Logged.
	Log Stage = iota + 1
	// Ship: the write goes to every peer's stream under Protocol(), or
	// what a peer misses is tracked durably and marked in its bitmap.
	// Reported with Shipped.
	Ship
	// Drain: a peer's missing of the write could not be tracked, so the
	// write fails; the runner waits for what the other peers took.
	// Reported with Drained.
	Drain
	// Local: the write goes to the local disk unless the disk is
	// detached. Reported with Wrote.
	Local
	// Wait: the runner waits for the peers as WaitFor() says. Reported
	// with Waited.
	Wait
	// CountLag: under protocols A and B, each peer's lag counts the write
	// from now (the client has it before the peers). Reported with
	// Counted.
	CountLag
	// Lease: the write completes only under a valid lease. Reported with
	// Leased.
	Lease
	// Done: the write is over; Outcome says how.
	Done
)

func (s Stage) String() string {
	switch s {
	case Log:
		return "log"
	case Ship:
		return "ship"
	case Drain:
		return "drain"
	case Local:
		return "local"
	case Wait:
		return "wait"
	case CountLag:
		return "count-lag"
	case Lease:
		return "lease"
	case Done:
		return "done"
	}
	return "stage(?)"
}

// Outcome is how a write ended.
type Outcome uint8

const (
	// Pending: not over yet.
	Pending Outcome = iota
	// Completed: the client may be told the write is done.
	Completed
	// LogFailed: the activity log could not be written and the disk could
	// not be detached (no peer holds the volume whole).
	LogFailed
	// TrackFailed: a peer misses the write and the volume could not
	// track that durably (Ship reported it): the write is not written
	// here either.
	TrackFailed
	// PeerFailed: a peer did not take the write and that could not be
	// tracked durably (Wait reported it).
	PeerFailed
	// NoCopy: the local disk did not take the write (detached) and no peer
	// acknowledged it.
	NoCopy
	// PullNotTaken: this primary copies newer data from a peer, so only
	// that peer's copy is whole, and that peer did not take the write.
	PullNotTaken
	// LocalFailed: the local disk failed the write and was not detached.
	LocalFailed
	// LeaseLost: the lease ran out before the write could complete.
	LeaseLost
)

func (o Outcome) String() string {
	switch o {
	case Pending:
		return "pending"
	case Completed:
		return "completed"
	case LogFailed:
		return "log-failed"
	case TrackFailed:
		return "track-failed"
	case PeerFailed:
		return "peer-failed"
	case NoCopy:
		return "no-copy"
	case PullNotTaken:
		return "pull-not-taken"
	case LocalFailed:
		return "local-failed"
	case LeaseLost:
		return "lease-lost"
	}
	return "outcome(?)"
}

// WaitMode is how Wait waits for the peers.
type WaitMode uint8

const (
	// WaitNone: the write does not wait for its peers (protocol A).
	WaitNone WaitMode = iota
	// WaitReceipts: every peer's receipt; a failure to track a peer's
	// miss ends the wait (protocol B).
	WaitReceipts
	// WaitAcks: every peer's acknowledgement, or the end of its stream
	// with the write tracked (protocol C, and any write the local disk
	// did not take: only a peer holds it).
	WaitAcks
)

// order is the stages every write goes through, in this order; a stage
// that does not apply to a write is passed over (Log for a write that
// does not go to the local disk, Drain unless Ship failed, CountLag when
// the write waited for every ack).
//
// THE EXTENT IS IN THE ACTIVITY LOG, DURABLY, BEFORE THE DATA IS WRITTEN
// ANYWHERE: after a crash, only the log's extents can differ between the
// replicas, and a restart resyncs only those.
var order = [...]Stage{Log, Ship, Drain, Local, Wait, CountLag, Lease}

// Write is one write-type request (a write, a TRIM, a WRITE_ZEROES piece)
// on its way through the stages.
type Write struct {
	next  int // index in order of the next stage to consider
	proto byte
	// toDisk: the write goes to the local disk (decided at admission,
	// once; a failed log turns it off).
	toDisk bool
	// logged: the Log stage ran; logFailed: it failed and the disk could
	// not be detached.
	logged, logFailed bool
	// trackFailed: Ship reported a peer's miss it could not track.
	trackFailed bool
	// wrote: the Local stage ran. skipped: the local disk did not take
	// the write (detached before or by its failure); localFailed: it
	// failed and the disk was not detached. pulling: the primary copies
	// newer data from a peer.
	wrote, skipped, localFailed, pulling bool
	// acked: a peer took the write; sourceAcked: the peer this primary
	// copies newer data from took it; peerFailed: a peer's miss could not
	// be tracked (Wait).
	acked, sourceAcked, peerFailed bool
	leaseLost                      bool
	outcome                        Outcome
}

// Begin starts a write under protocol proto ('A', 'B' or 'C'); toDisk
// says whether it goes to the local disk (false while the disk is
// detached: what it misses is marked instead).
func Begin(proto byte, toDisk bool) Write {
	return Write{proto: proto, toDisk: toDisk}
}

// Next returns the stage to run now; Done once the write is over.
func (w *Write) Next() Stage {
	if w.outcome != Pending {
		return Done
	}
	for w.next < len(order) {
		s := order[w.next]
		if w.applies(s) {
			return s
		}
		w.next++
	}
	w.outcome = w.decide()
	return Done
}

// applies says whether stage s runs for this write.
func (w *Write) applies(s Stage) bool {
	switch s {
	case Log:
		return w.toDisk
	case Drain:
		return w.trackFailed
	case CountLag:
		return w.WaitFor() != WaitAcks && !w.localFailed
	case Lease:
		// A write that failed does not wait for the lease.
		return w.failure() == Pending
	}
	return true
}

// advance moves past stage s, which must be the current one.
func (w *Write) advance(s Stage) {
	if w.next >= len(order) || order[w.next] != s || w.outcome != Pending {
		panic("writepath: " + s.String() + " reported out of order")
	}
	w.next++
}

// end makes the write's outcome o: no further stage runs.
func (w *Write) end(o Outcome) { w.outcome = o }

// Logged reports the Log stage: ok when the extent is in the log; when
// it is not, detached says the disk was detached for it (the write goes
// on without the local disk), else the write fails.
func (w *Write) Logged(ok, detached bool) {
	w.advance(Log)
	w.logged = true
	if ok {
		return
	}
	w.toDisk = false
	if !detached {
		w.logFailed = true
		w.end(LogFailed)
	}
}

// Protocol is the protocol the write is shipped and waited for under:
// the volume's, but C when only a peer holds the whole volume (the write
// does not go to the local disk, or this primary copies newer data from
// a peer: pulling).
func (w *Write) Protocol(pulling bool) byte {
	if !w.toDisk || pulling {
		w.proto = 'C'
	}
	return w.proto
}

// Shipped reports the Ship stage: trackFailed when a peer misses the
// write and that could not be tracked durably.
func (w *Write) Shipped(trackFailed bool) {
	w.advance(Ship)
	w.trackFailed = trackFailed
}

// Drained reports the Drain stage: the write fails.
func (w *Write) Drained() {
	w.advance(Drain)
	w.end(TrackFailed)
}

// ToDisk says whether the Local stage writes the local disk (the runner
// skips it too when the disk was detached since the admission).
func (w *Write) ToDisk() bool { return w.toDisk }

// Wrote reports the Local stage: skipped when the local disk did not take
// the write (it was detached, or failed and was detached for it); failed
// when it failed and stays attached; pulling when this primary copies
// newer data from a peer.
func (w *Write) Wrote(skipped, failed, pulling bool) {
	w.advance(Local)
	w.wrote = true
	w.skipped, w.localFailed, w.pulling = skipped || !w.toDisk, failed && !skipped, pulling
}

// WaitFor says how the Wait stage waits: a write the local disk did not
// take waits for every ack, whatever the protocol (only a peer holds it).
func (w *Write) WaitFor() WaitMode {
	if w.skipped {
		return WaitAcks
	}
	switch w.proto {
	case 'C':
		return WaitAcks
	case 'B':
		return WaitReceipts
	}
	return WaitNone
}

// Waited reports the Wait stage: acked when a peer took the write;
// sourceAcked when the peer this primary copies newer data from took it
// (while it pulls: any other peer's copy of the block may be stale, and a
// pull that starts again copies the source's over this write); failed
// when a peer's miss of it could not be tracked durably.
func (w *Write) Waited(acked, sourceAcked, failed bool) {
	w.advance(Wait)
	w.acked, w.sourceAcked, w.peerFailed = acked, sourceAcked, failed
}

// Counted reports the CountLag stage.
func (w *Write) Counted() { w.advance(CountLag) }

// Leased reports the Lease stage: ok when the lease held.
func (w *Write) Leased(ok bool) {
	w.advance(Lease)
	w.leaseLost = !ok
}

// failure is what fails the write once it waited for its peers (Pending
// when nothing does), the first that holds of: a peer's miss not
// tracked, no copy anywhere, a pull's write its source did not take, a
// local write that failed.
func (w *Write) failure() Outcome {
	switch {
	case w.peerFailed:
		return PeerFailed
	case w.skipped && !w.acked:
		return NoCopy
	case w.pulling && !w.sourceAcked:
		return PullNotTaken
	case w.localFailed:
		return LocalFailed
	}
	return Pending
}

// decide is the outcome once every stage that applies ran.
func (w *Write) decide() Outcome {
	if o := w.failure(); o != Pending {
		return o
	}
	if w.leaseLost {
		return LeaseLost
	}
	return Completed
}

// Outcome is how the write ended (Pending until Next returned Done).
func (w *Write) Outcome() Outcome { return w.outcome }
