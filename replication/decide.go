package replication

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// Generation identifies a lineage of data (DRBD's generation UUID). Two
// disks with the same current generation hold the same data at a flush
// boundary. The zero Generation means "no consistent data".
type Generation [16]byte

// NewGeneration returns a fresh random generation.
func NewGeneration() Generation {
	var g Generation
	if _, err := rand.Read(g[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return g
}

// IsZero reports whether g is the "no consistent data" generation.
func (g Generation) IsZero() bool { return g == Generation{} }

// String renders g as 16 hex digits, the way logs and status show it.
func (g Generation) String() string {
	if g.IsZero() {
		return "0000000000000000"
	}
	return hex.EncodeToString(g[:8])
}

// MarshalText renders the full generation for JSON and bbolt.
func (g Generation) MarshalText() ([]byte, error) {
	return []byte(hex.EncodeToString(g[:])), nil
}

// UnmarshalText parses what MarshalText wrote.
func (g *Generation) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*g = Generation{}
		return nil
	}
	if len(b) != 32 {
		return fmt.Errorf("generation %q: want 32 hex digits", b)
	}
	_, err := hex.Decode(g[:], b)
	return err
}

// SyncKind is what a connection must do before the peer is UpToDate.
type SyncKind int

// Sync kinds.
const (
	// NoSync: the peer already holds the primary's data.
	NoSync SyncKind = iota
	// BitmapSync: the peer holds the data the primary's bitmap for it starts
	// from; resync only the marked blocks.
	BitmapSync
	// FullSync: the peer holds an older state of this data, or none;
	// resync every block.
	FullSync
	// Refuse: the peer holds data this node never had (another lineage):
	// syncing either way could lose writes; the operator decides.
	Refuse
)

func (k SyncKind) String() string {
	switch k {
	case NoSync:
		return "no-sync"
	case BitmapSync:
		return "bitmap-sync"
	case FullSync:
		return "full-sync"
	case Refuse:
		return "refuse"
	}
	return fmt.Sprintf("SyncKind(%d)", int(k))
}

// SyncInput is what a primary knows when a peer connects.
type SyncInput struct {
	// Current is the primary's current generation.
	Current Generation
	// Bitmap is the generation the primary's bitmap for this peer starts
	// from; HaveBitmap is false when the primary has no bitmap for the peer
	// (it restarted, or never had one).
	Bitmap     Generation
	HaveBitmap bool
	// Peer is the generation the peer reports for its disk.
	Peer Generation
	// History holds the primary's earlier generations, newest first.
	History []Generation
}

// SyncDecision is the outcome of DecideSync and the rule that chose it.
type SyncDecision struct {
	Kind SyncKind
	Rule string
}

// DecideSync decides what a primary must send a connecting peer. It is the
// generation-UUID comparison of DRBD (research/anchors-replication.md §1.6),
// reduced to what a primary with an in-memory bitmap can know.
func DecideSync(in SyncInput) SyncDecision {
	switch {
	case !in.Current.IsZero() && in.Peer == in.Current:
		return SyncDecision{NoSync, "peer current equals my current"}
	case in.HaveBitmap && !in.Peer.IsZero() && in.Peer == in.Bitmap:
		return SyncDecision{BitmapSync, "peer current equals my bitmap generation"}
	case in.Peer.IsZero():
		return SyncDecision{FullSync, "peer has no consistent data"}
	}
	for _, g := range in.History {
		if !g.IsZero() && g == in.Peer {
			return SyncDecision{FullSync, "peer holds an older generation of mine"}
		}
	}
	return SyncDecision{Refuse, "unrelated data: the peer holds a generation I never had"}
}
