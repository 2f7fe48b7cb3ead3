package node

import "context"

// peerSet is a volume's senders, one per other node that holds the volume
// (peer.go), and the context they run in. Its fields are guarded by the
// volume's v.mu: its methods are called with v.mu held.
type peerSet struct {
	byName map[string]*peer
	// list is byName as a slice, replaced (never changed in place)
	// whenever byName changes: the IO path reads it without copying.
	list []*peer
	// cancel ends ctx, the context the running senders were started
	// with (startPeersLocked); stopPeers takes it.
	cancel context.CancelFunc
	ctx    context.Context
}

// rebuildListLocked publishes byName as a new list.
func (s *peerSet) rebuildListLocked() {
	list := make([]*peer, 0, len(s.byName))
	for _, p := range s.byName {
		list = append(list, p)
	}
	s.list = list
}
