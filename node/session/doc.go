// Package session is the primary's replication stream to one peer, from
// the end of its handshake to its failure (session.go): the entries on
// their way, batched into frames, their acks, the congestion controller
// (congestion.go), the resync and verify runs in flight (Window), the
// peer's lag, and the heartbeat the streams to one peer node share
// (pairbeat.go). What the peer misses when the stream ends is marked in its
// bitmap, after the volume durably tracks it; so is what it acknowledged
// from its cache since its last acknowledged flush (cached.go), BEFORE a
// flush waiting on it completes.
//
// It imports the replication rules, the volume's state machine (the rule
// of what the peer is shown as its stream congests, drains, catches up or
// gets in sync: volstate.StreamEvent, which the loop hands Peer.Stream),
// transport/frame's frames (a leaf of the wire that links no network)
// and the standard library; the peer's
// bitmap is a Bitmap (the node's is metadata's PeerBitmap). Never the
// node (github.com/replvol/replvol/node), node/cluster, metadata, web,
// raft, memberlist or bbolt (layering_test.go in the node). The node's peer implements Peer and
// hands the session its values in a Config: that is the whole way back.
//
// One goroutine, each session's loop, owns everything it holds. Many
// goroutines call it at once: the writers (Enqueue, Submit, MarkBehind,
// CompletedLocally), the resync and verify windows (Window.Runs), the
// catch-up resync and whoever reads the state (Congested, CatchUpPaused,
// Resting, Context) or ends it (Cancel, Fail). They talk to the loop
// through its inbox, in one order, without waiting for a busy loop
// (deliver: what was delivered before the stream ended is taken by its
// end), and wait on the Pending they get back (a write to several peers
// on one Joint, which the last of its entries to complete releases:
// joint.go); the receiving goroutine hands the loop acks and replies as
// messages; one sending goroutine writes the frames it builds. The
// package declares no mutex.
//
// The loop is a step function over its inbox: each turn its
// select takes one event (a message of the inbox, an ack or a read reply
// of the peer, a syncDone committed, a tick, the end of a rest, the first
// error, the context's end) and hands it to handle, which does what the
// loop does with it and what follows every message (the peer's silence
// counted from when the stream stops being idle, the queued entries sent
// in frames to s.out, the rest looked at) and says whether the session
// ends; begin readies the loop before its first step and finish hands
// back what is left after its last. The stream is a Stream (Send, Recv,
// Close), a *transport.ReplStream in the node. In production the loop
// drives the step, beside its sending and receiving goroutines; a Stepper
// (stepper.go) drives it on its caller's goroutine instead, with none of
// the session's goroutines running: the caller hands the step the events
// in the order it chooses (a test's or a simulation's seeded order:
// step_test.go), takes the frames it built and the entries it completed,
// and hands it the peer's frames, which it makes into events (received).
package session
