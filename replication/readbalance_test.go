package replication

import (
	"strings"
	"testing"
)

func TestPickRead(t *testing.T) {
	local := LocalReadView{Disk: UpToDate}
	busyLocal := LocalReadView{Disk: UpToDate, Pending: 8, Congested: true}
	peer := PeerReadView{Repl: Connected, Disk: UpToDate, InSync: true}
	withPending := func(p PeerReadView, n int) PeerReadView { p.Pending = n; return p }
	congested := func(p PeerReadView) PeerReadView { p.Congested = true; return p }
	oneBlockOutOfSync := peer
	oneBlockOutOfSync.InSync = false
	behind := peer
	behind.Repl = Ahead
	outdated := peer
	outdated.Disk = Outdated
	cases := []struct {
		name   string
		policy ReadBalancing
		local  LocalReadView
		peers  []PeerReadView
		want   []int // the picks of successive reads; nil: no copy may serve
	}{
		{"prefer-local reads the local disk, however busy", ReadPreferLocal, busyLocal, []PeerReadView{peer}, []int{ReadLocal, ReadLocal}},
		{"the zero policy prefers local", "", local, []PeerReadView{peer}, []int{ReadLocal}},
		{"prefer-local with a detached disk reads a peer", ReadPreferLocal, LocalReadView{Disk: UpToDate, Detached: true}, []PeerReadView{peer}, []int{0}},
		{"prefer-local with an Inconsistent disk reads the uncongested peer", ReadPreferLocal, LocalReadView{Disk: Inconsistent},
			[]PeerReadView{congested(peer), withPending(peer, 3)}, []int{1}},
		{"a peer with one block of the range out of sync is never chosen", ReadRoundRobin, LocalReadView{Disk: Diskless},
			[]PeerReadView{oneBlockOutOfSync, peer}, []int{1, 1, 1}},
		{"a peer with one block out of sync is never chosen, even with nothing else", ReadLeastPending, LocalReadView{Disk: Diskless},
			[]PeerReadView{oneBlockOutOfSync}, nil},
		{"a peer that is not Connected is never chosen", ReadRoundRobin, local, []PeerReadView{behind}, []int{ReadLocal, ReadLocal}},
		{"a peer that is not UpToDate is never chosen", ReadLeastPending, LocalReadView{Disk: UpToDate, Pending: 50}, []PeerReadView{outdated}, []int{ReadLocal}},
		{"no readable copy at all", ReadPreferLocal, LocalReadView{Disk: Failed}, []PeerReadView{oneBlockOutOfSync, outdated}, nil},
		{"round-robin alternates local and peer", ReadRoundRobin, local, []PeerReadView{peer}, []int{ReadLocal, 0, ReadLocal, 0}},
		{"round-robin skips the peer out of sync", ReadRoundRobin, local, []PeerReadView{peer, oneBlockOutOfSync, peer}, []int{ReadLocal, 0, 2, ReadLocal}},
		{"round-robin without a local disk alternates the peers", ReadRoundRobin, LocalReadView{Disk: Diskless}, []PeerReadView{peer, peer}, []int{0, 1, 0}},
		{"least-pending takes the peer with fewer pending reads", ReadLeastPending, LocalReadView{Disk: UpToDate, Pending: 4},
			[]PeerReadView{withPending(peer, 6), withPending(peer, 2)}, []int{1}},
		{"least-pending breaks a tie for the local disk", ReadLeastPending, LocalReadView{Disk: UpToDate, Pending: 2},
			[]PeerReadView{withPending(peer, 2)}, []int{ReadLocal}},
		{"least-pending breaks a tie between peers for the first", ReadLeastPending, LocalReadView{Disk: Diskless},
			[]PeerReadView{withPending(peer, 3), withPending(peer, 1), withPending(peer, 1)}, []int{1}},
		{"when-congested-remote reads an idle local disk", ReadWhenCongestedRemote, local, []PeerReadView{peer}, []int{ReadLocal}},
		{"when-congested-remote reads a peer when the local disk is congested", ReadWhenCongestedRemote, busyLocal, []PeerReadView{peer}, []int{0}},
		{"when-congested-remote stays local when every peer is congested too", ReadWhenCongestedRemote, busyLocal, []PeerReadView{congested(peer)}, []int{ReadLocal}},
		{"when-congested-remote takes the uncongested peer", ReadWhenCongestedRemote, busyLocal,
			[]PeerReadView{congested(peer), withPending(peer, 9)}, []int{1}},
		{"when-congested-remote never reads a peer out of sync", ReadWhenCongestedRemote, busyLocal, []PeerReadView{oneBlockOutOfSync}, []int{ReadLocal}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := ReadPicker{Policy: c.policy}
			if c.want == nil {
				if got, ok := p.Pick(c.local, c.peers); ok {
					t.Fatalf("picked %d, want no copy", got)
				}
				return
			}
			for i, want := range c.want {
				got, ok := p.Pick(c.local, c.peers)
				if !ok || got != want {
					t.Fatalf("read %d: got %d, %v, want %d", i, got, ok, want)
				}
			}
		})
	}
}

func TestParseReadBalancing(t *testing.T) {
	for _, s := range []string{"prefer-local", "round-robin", "least-pending", "when-congested-remote"} {
		if p, err := ParseReadBalancing(s); err != nil || string(p) != s {
			t.Fatalf("ParseReadBalancing(%q) = %q, %v", s, p, err)
		}
	}
	if p, err := ParseReadBalancing(""); err != nil || p != ReadPreferLocal {
		t.Fatalf(`ParseReadBalancing("") = %q, %v; want prefer-local`, p, err)
	}
	_, err := ParseReadBalancing("prefer-remote")
	if err == nil || !strings.Contains(err.Error(), "want prefer-local, round-robin, least-pending or when-congested-remote") {
		t.Fatalf("an unknown policy: %v", err)
	}
}
