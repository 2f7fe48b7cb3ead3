package node

import (
	"fmt"
	"time"

	"github.com/replvol/replvol/metadata/statefile"
	"github.com/replvol/replvol/node/cluster"
)

// Events of the cluster as this node sees it: the raft leader changing,
// the raft quorum lost and regained, and a primary's lease running out
// (its IO freezes) and coming back. Each node records its own view.

// clusterEvents records the cluster's events until stop closes. It looks
// at each leader change and every clusterTick.
func (n *Node) clusterEvents(stop <-chan struct{}) {
	tick := n.clock.NewTicker(clusterTick)
	defer tick.Stop()
	// As long as status calls a quorumless spell an election
	// (cluster.Timing.ElectionGrace): the event and the warning agree.
	w := clusterWatch{grace: n.cl.c.ElectionGrace()}
	for {
		changed := n.cl.c.LeaderChanged()
		for _, e := range w.observe(n.name, n.cl.c.Status(), n.clock.Now()) {
			n.emit(e)
		}
		select {
		case <-stop:
			return
		case <-changed:
		case <-tick.C():
		}
	}
}

// clusterWatch turns the cluster statuses one node sees into events. It
// is a pure rule: observe(status, now) → events.
type clusterWatch struct {
	// grace is how long a change must last to be an event: an election
	// that picks a new leader within it is one leader change, not a loss
	// of the leader and of quorum.
	grace time.Duration
	// leader is the last leader reported ("" before the first).
	leader string
	// quorum: a quorum was seen and no loss reported since; lost: a loss
	// was reported.
	quorum, lost bool
	// since is when the current leaderless or quorumless spell began
	// (zero while there is a leader with a quorum).
	noLeaderSince, noQuorumSince time.Time
}

func (w *clusterWatch) observe(self string, st cluster.Status, now time.Time) []statefile.Event {
	var out []statefile.Event
	switch {
	case st.Leader != "":
		w.noLeaderSince = time.Time{}
		if st.Leader != w.leader {
			msg := fmt.Sprintf("raft leader is %s", st.Leader)
			switch w.leader {
			case "":
			case "none":
				msg = fmt.Sprintf("raft leader is now %s (there was none)", st.Leader)
			default:
				msg = fmt.Sprintf("raft leader is now %s (was %s)", st.Leader, w.leader)
			}
			out = append(out, statefile.Event{Kind: "raft-leader", Old: w.leader, New: st.Leader, Message: msg})
			w.leader = st.Leader
		}
	case w.leader != "" && w.leader != "none":
		// A leader that is gone counts once no successor shows up in time.
		if w.noLeaderSince.IsZero() {
			w.noLeaderSince = now
		}
		if now.Sub(w.noLeaderSince) >= w.grace {
			out = append(out, statefile.Event{Kind: "raft-leader", Old: w.leader, New: "none",
				Message: fmt.Sprintf("raft has no leader (was %s): an election is under way or no majority is in reach", w.leader)})
			w.leader = "none"
		}
	}
	switch {
	case st.Quorum:
		w.noQuorumSince = time.Time{}
		if w.lost {
			out = append(out, statefile.Event{Kind: "quorum-regained", Old: "no quorum", New: "quorum",
				Message: fmt.Sprintf("%s is in contact with a raft majority again (leader %s): failover and lease renewals work", self, st.Leader)})
		}
		w.quorum, w.lost = true, false
	case w.quorum && !w.lost:
		if w.noQuorumSince.IsZero() {
			w.noQuorumSince = now
		}
		if now.Sub(w.noQuorumSince) >= w.grace {
			out = append(out, statefile.Event{Kind: "quorum-lost", Old: "quorum", New: "no quorum",
				Message: fmt.Sprintf("%s is cut off from the raft majority: no failover, and its primaries freeze their IO when their lease runs out", self)})
			w.lost = true
		}
	}
	return out
}

// leaseWatch turns one primary term's lease renewals into events: the
// lease it held ran out (its IO is frozen), and a renewal brought it back.
type leaseWatch struct {
	held, lost bool
}

// note looks at v's lease after a renewal attempt of epoch's term (err:
// why it failed).
func (w *leaseWatch) note(v *Volume, epoch uint64, err error) {
	v.mu.Lock()
	held := v.leaseHeldLocked()
	v.mu.Unlock()
	switch {
	case held && w.lost:
		v.node.emit(statefile.Event{Volume: v.name, Kind: "lease-regained", Old: "frozen", New: "serving",
			Message: fmt.Sprintf("%s's lease as primary of %s at epoch %d is renewed: IO goes on", v.self, v.name, epoch)})
		w.lost = false
	case !held && w.held && !w.lost:
		msg := fmt.Sprintf("%s's lease as primary of %s at epoch %d ran out: IO is frozen until the raft leader renews it", v.self, v.name, epoch)
		if err != nil {
			msg += " (" + err.Error() + ")"
		}
		v.node.emit(statefile.Event{Volume: v.name, Kind: "lease-lost", Old: "serving", New: "frozen", Message: msg})
		w.lost = true
	}
	w.held = w.held || held
}
