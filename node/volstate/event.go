package volstate

import (
	"time"

	"github.com/replvol/replvol/replication"
)

// Event is something that happened to the volume; Step says what follows.
type Event interface{ isEvent() }

// Opened: the node loaded the volume's durable state (before Started).
type Opened struct{}

// Started: the node opened the volume with its durable state.
type Started struct{}

// ResyncStarted: a resync into this disk from the primary Peer began: the
// disk holds no consistent data until it ends, and resumes from From.
type ResyncStarted struct {
	Peer string
	From replication.Generation
}

// ReplicaWriteFailed: a write of the primary's stream failed on this
// node's disk: the primary marks what it sent, and resyncs it once the
// disk takes writes again.
type ReplicaWriteFailed struct{}

// IncomingEnded: the stream of the primary applied here ended.
type IncomingEnded struct{}

// SplitBrainFound: this primary's connection to Peer found that both
// changed the data since they last met, by the generation rule Rule (the
// peer's refusal, or this node's handshake); "" when the peer gave none.
type SplitBrainFound struct {
	Peer string
	Rule string
}

// PeerConnected: this primary's handshake with Peer got the peer's
// answer: its generations toward this node, whether it is a primary and
// at which epoch, and its disk. Marked: blocks are marked for the peer on
// either side. DiscardFrom: the peer gives up its changes after a split
// brain. NextGen is the generation a resync that starts without a bitmap
// generation takes.
type PeerConnected struct {
	Peer        string
	Session     uint64
	UUIDs       replication.UUIDSet
	PeerPrimary bool
	PeerEpoch   uint64
	PeerDisk    replication.DiskState
	Marked      bool
	DiscardFrom bool
	NextGen     replication.Generation
	// PeerOutdated: raft records Peer Outdated under this primary (its
	// record names this node primary): the peer is never the source of a
	// copy onto it (replication.UUIDDecision.TowardOutdated).
	PeerOutdated bool
}

// PeerAnswered: Peer took this primary's stream, as the handshake
// decided (node's side of PeerConnected); Pulling: this node copies newer
// data from it.
type PeerAnswered struct {
	Peer    string
	Pulling bool
}

// PrimaryReached: the primary From opened a stream to this node at Epoch
// with its generations (the receiving side of a handshake).
type PrimaryReached struct {
	From  string
	Epoch uint64
	UUIDs replication.UUIDSet
	// Misdirected: the stream is for another node. SizeDiffers: the
	// primary's volume is not this node's size.
	Misdirected, SizeDiffers bool
	// HandedOver: this node knows From's promotion at Epoch was a
	// handover (raft recorded no failover at it); when it does not know,
	// a newer primary is taken to have failed over (AuthorityChanged).
	HandedOver bool
}

// NewerPrimary: a peer answered this node's stream that a primary of
// Epoch, newer than this node's, exists (it refused the stream).
type NewerPrimary struct{ Epoch uint64 }

// StreamEvent is news of one stream to one peer: the peer's replication
// state alone follows (Peer.Streamed), and nothing is written, so a
// driver steps it without waiting for a write (node's session loop tells
// it to the volume's loop, which steps it between drives).
// An event of a stream other than the peer's current one changes nothing.
type StreamEvent interface {
	Event
	// Stream names the peer and the stream.
	Stream() (peer string, session uint64)
}

// PeerLost: the stream Session to Peer ended.
type PeerLost struct {
	Peer    string
	Session uint64
}

// PeerCongested: the congestion controller of stream Session started
// marking Peer's writes instead of shipping them (DRBD's Ahead); a
// resync of the peer pauses meanwhile.
type PeerCongested struct {
	Peer    string
	Session uint64
}

// PeerDrained: the congestion controller of stream Session ships Peer's
// writes again; Resyncing: a resync of the peer (the one Ahead paused, or
// the catch-up of what was marked meanwhile) goes on.
type PeerDrained struct {
	Peer      string
	Session   uint64
	Resyncing bool
}

// PeerCatchingUp: stream Session started the catch-up resync of the
// blocks marked for Peer under congestion.
type PeerCatchingUp struct {
	Peer    string
	Session uint64
}

// PeerInSync: Peer acknowledged, on stream Session, that it holds this
// primary's generation (the sync-done of a resync or of a catch-up).
type PeerInSync struct {
	Peer    string
	Session uint64
}

// LinkStarted: the driver started its link to Peer again (a sender
// that had stopped: a refusal an operator lifted): the peer is Connecting
// until a stream is taken. The rules that start the links (Started,
// Connect, a promotion's fresh senders) make the peers Connecting
// themselves.
type LinkStarted struct{ Peer string }

// LinkDown: the driver's link to Peer lost its stream, whichever the rules
// hold (the link knows that its connection ended, not which stream the
// rules count on), and is retried: the peer is Connecting, as for
// PeerLost of that stream. ForGood: the link stopped (its context ended,
// or the peer refused it until an operator acts): StandAlone.
type LinkDown struct {
	Peer    string
	ForGood bool
}

func (e PeerLost) Stream() (string, uint64)       { return e.Peer, e.Session }
func (e PeerCongested) Stream() (string, uint64)  { return e.Peer, e.Session }
func (e PeerDrained) Stream() (string, uint64)    { return e.Peer, e.Session }
func (e PeerCatchingUp) Stream() (string, uint64) { return e.Peer, e.Session }
func (e PeerInSync) Stream() (string, uint64)     { return e.Peer, e.Session }

// AuthorityChanged: raft's state machine names Primary at Epoch for the
// volume (Known false: nobody registered it yet).
type AuthorityChanged struct {
	Known   bool
	Primary string
	Epoch   uint64
	Now     time.Time
	// Failover: Primary took over at Epoch without a handover from the
	// old primary (replication.VolumeAuthority.FailedOverAt): a write of
	// the old one may have been in flight, and the activity logs are
	// reconciled. A handover leaves none in flight.
	Failover bool
}

// LeaseRenewed: the renewals of the term Epoch got a lease until Until.
type LeaseRenewed struct {
	Epoch uint64
	Until time.Time
}

// DiskFailed: an IO on the local disk failed. Whether a peer holds every
// write is the peers' fact (Peer.InSync) when the step is taken.
type DiskFailed struct{}

// DiskWorks: a probe of the detached disk succeeded.
type DiskWorks struct{}

// AttachFailed: the copy back of what a reattached disk missed failed, or
// its end could not be recorded: the disk is out of service again (still
// stale on stable storage), and its probes go on.
type AttachFailed struct{}

// LocalResyncFinished: the blocks the local disk missed were copied back
// from a peer and synced. It is refused while the disk still misses some
// (State.LocalMissing: a write marked them after the copy passed them),
// and when the disk is not being re-attached (it failed again meanwhile).
type LocalResyncFinished struct{}

// WriteMissed: this primary starts a write Peer may not see (it has no
// stream, or its stream is Behind); Peer last held Held (zero: the
// current generation), and the data moves on to Next. MayHold, when not
// zero, is a generation Peer may hold though this node tracks it (a
// sync-done whose ack never came, a resync between equal generations cut
// off): when it is the current one, the data moves on all the same,
// Peer's bitmap kept. Behind: the peer's stream took the write to mark,
// not to ship (pull-ahead decided by the stream, which the peer's state
// may not show yet). A write to a peer that streams and is not behind
// goes to its stream: it misses nothing.
type WriteMissed struct {
	Peer                string
	Held, Next, MayHold replication.Generation
	Behind              bool
}

// ResyncFinished: a resync with Peer ended. As target (a pull), this node
// now holds Current and descends from History, or from its own history
// when OwnHistory is set. As source, Peer acknowledged on stream Session
// that it holds Current: it is in sync only while that stream is the
// peer's, Current this node's generation and nothing is marked for it.
type ResyncFinished struct {
	Peer       string
	AsTarget   bool
	Session    uint64
	Current    replication.Generation
	History    []replication.Generation
	OwnHistory bool
}

// Quiesced: the IO a pending role change waited for has drained (the
// export closed, requests in flight answered, senders stopped, bitmaps
// flushed).
type Quiesced struct{}

// HandedOver: the peer of a pending handover is in sync with everything
// this node wrote.
type HandedOver struct{}

// HandoverAborted: a pending handover failed; this node goes on serving.
type HandoverAborted struct{}

// Promote is the operator's (or a switchover's) promotion at Epoch of a
// node that holds exactly the data the old primary handed over (Gen).
type Promote struct {
	Epoch uint64
	Gen   replication.Generation
	Now   time.Time
}

// Retake makes this node primary again at Epoch after a switchover raft
// did not record: it handed over Gen, and raft (when known) still names it.
type Retake struct {
	Epoch            uint64
	Gen              replication.Generation
	AuthorityKnown   bool
	AuthorityPrimary string
	AuthorityEpoch   uint64
}

// Force is replctl primary --force: primary without a handover, at an
// epoch above every epoch heard of (and above raft's, AuthorityEpoch,
// when it answers). A disk with no consistent data is adopted as the
// volume's data with NewGen.
type Force struct {
	Now            time.Time
	NewGen         replication.Generation
	AuthorityEpoch uint64
}

// Demote begins a switchover to To.
type Demote struct{ To string }

// DiscardMyData: the operator resolves a split brain with this node as
// its victim.
type DiscardMyData struct{}

// Disconnect and Connect: the operator disconnects or reconnects this
// node's replication of the volume.
type (
	Disconnect struct{}
	Connect    struct{}
)

// Stop: the volume shuts down; Removed: because the cluster file no
// longer lists it. A removal stops the IO first, and its lease goes on
// while the export drains its clients: the shutdown that follows steps
// Stop again, and that stops the lease.
type Stop struct{ Removed bool }

func (Opened) isEvent()              {}
func (Started) isEvent()             {}
func (ResyncStarted) isEvent()       {}
func (ReplicaWriteFailed) isEvent()  {}
func (IncomingEnded) isEvent()       {}
func (SplitBrainFound) isEvent()     {}
func (PeerConnected) isEvent()       {}
func (PeerAnswered) isEvent()        {}
func (LinkStarted) isEvent()         {}
func (LinkDown) isEvent()            {}
func (PrimaryReached) isEvent()      {}
func (NewerPrimary) isEvent()        {}
func (PeerLost) isEvent()            {}
func (PeerCongested) isEvent()       {}
func (PeerDrained) isEvent()         {}
func (PeerCatchingUp) isEvent()      {}
func (PeerInSync) isEvent()          {}
func (AuthorityChanged) isEvent()    {}
func (LeaseRenewed) isEvent()        {}
func (DiskFailed) isEvent()          {}
func (DiskWorks) isEvent()           {}
func (AttachFailed) isEvent()        {}
func (LocalResyncFinished) isEvent() {}
func (WriteMissed) isEvent()         {}
func (ResyncFinished) isEvent()      {}
func (Quiesced) isEvent()            {}
func (HandedOver) isEvent()          {}
func (HandoverAborted) isEvent()     {}
func (Promote) isEvent()             {}
func (Retake) isEvent()              {}
func (Force) isEvent()               {}
func (Demote) isEvent()              {}
func (DiscardMyData) isEvent()       {}
func (Disconnect) isEvent()          {}
func (Connect) isEvent()             {}
func (Stop) isEvent()                {}
