package replication

// The read-balancing rule: where one read of the primary's client goes,
// its own disk or an UpToDate peer (config read_balancing), as a ZFS
// mirror reads both halves. node's read path calls ReadPicker.Pick for
// every read and sends it where the pick says. A block out of sync on a
// peer is never read from it.

import "fmt"

// ReadBalancing is a volume's read-balancing policy (DRBD's names).
type ReadBalancing string

// Read-balancing policies.
const (
	// ReadPreferLocal reads the local disk whenever it may be read.
	ReadPreferLocal ReadBalancing = "prefer-local"
	// ReadRoundRobin takes the candidates in turn, one read each.
	ReadRoundRobin ReadBalancing = "round-robin"
	// ReadLeastPending takes the candidate with the fewest reads pending;
	// a tie goes to the local disk, then to the first peer.
	ReadLeastPending ReadBalancing = "least-pending"
	// ReadWhenCongestedRemote reads the local disk unless it is congested,
	// and then an uncongested peer.
	ReadWhenCongestedRemote ReadBalancing = "when-congested-remote"
)

// ParseReadBalancing checks a policy name; "" is prefer-local.
func ParseReadBalancing(s string) (ReadBalancing, error) {
	if s == "" {
		return ReadPreferLocal, nil
	}
	return parseName("read_balancing", s, ReadPreferLocal, ReadRoundRobin, ReadLeastPending, ReadWhenCongestedRemote)
}

// LocalReadView is what the read path knows of the local disk.
type LocalReadView struct {
	Disk DiskState
	// Detached: the disk was detached after IO errors; it is never read,
	// whatever state it had.
	Detached bool
	Pending  int // reads issued and not completed
	// Congested: the disk is busy (the caller's judgement: a queue past
	// its limit, paths failing over).
	Congested bool
}

// PeerReadView is what the read path knows of one peer for one read.
type PeerReadView struct {
	Repl ReplState // towards the peer; only Connected peers are read
	Disk DiskState // the peer's disk; only UpToDate peers are read
	// InSync: no block of the read's range is marked out of sync for the
	// peer, AND none is covered by a write the peer has not acknowledged
	// (under protocol A a write completes before the peer holds it, so a
	// read there would return older data).
	InSync    bool
	Pending   int // reads sent to the peer and not answered
	Congested bool
}

// ReadLocal is the pick of the local disk; a pick i >= 0 is peers[i].
const ReadLocal = -1

// ReadPicker chooses where each read goes. Its round-robin turn is its
// only state; the zero value prefers local. It is for a single goroutine.
type ReadPicker struct {
	Policy ReadBalancing
	turn   uint64
}

// Pick returns where one read goes: ReadLocal or an index into peers. It
// returns false when no copy may serve the read (the local disk is not
// readable and no peer is Connected, UpToDate and in sync over the range).
func (p *ReadPicker) Pick(local LocalReadView, peers []PeerReadView) (int, bool) {
	localOK := !local.Detached && local.Disk == UpToDate
	candidates, remote := 0, -1 // remote: the best peer (uncongested, fewest pending, first)
	if localOK {
		candidates++
	}
	for i, peer := range peers {
		if peer.readable() {
			candidates++
			if remote < 0 || peer.betterThan(peers[remote]) {
				remote = i
			}
		}
	}
	if candidates == 0 {
		return 0, false
	}
	switch p.Policy {
	case ReadRoundRobin:
		k := int(p.turn % uint64(candidates))
		p.turn++
		return nthCandidate(localOK, peers, k), true
	case ReadLeastPending:
		best, pending := ReadLocal, local.Pending
		for i, peer := range peers {
			if peer.readable() && (peer.Pending < pending || !localOK && best == ReadLocal) {
				best, pending = i, peer.Pending
			}
		}
		return best, true
	case ReadWhenCongestedRemote:
		if !localOK || local.Congested && remote >= 0 && !peers[remote].Congested {
			return remote, true
		}
		return ReadLocal, true
	case ReadPreferLocal, "":
		if localOK {
			return ReadLocal, true
		}
		return remote, true
	}
	panic(fmt.Sprintf("replication: read-balancing policy %q", p.Policy))
}

func (peer PeerReadView) readable() bool {
	return peer.Repl == Connected && peer.Disk == UpToDate && peer.InSync
}

// betterThan orders peers for the policies that fall back to one:
// uncongested first, then fewer pending reads.
func (peer PeerReadView) betterThan(other PeerReadView) bool {
	if peer.Congested != other.Congested {
		return !peer.Congested
	}
	return peer.Pending < other.Pending
}

// nthCandidate returns the k-th candidate in the order: the local disk (if
// localOK), then the readable peers by index.
func nthCandidate(localOK bool, peers []PeerReadView, k int) int {
	if localOK {
		if k == 0 {
			return ReadLocal
		}
		k--
	}
	for i, peer := range peers {
		if peer.readable() {
			if k == 0 {
				return i
			}
			k--
		}
	}
	panic("replication: round-robin past the read candidates")
}
