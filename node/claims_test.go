package node

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

// TestTheMountClaimRule: a volume's claim is one mount's at a time. A take
// while another holder's claim lasts is refused, naming where that mount
// is and how to unmount it; the holder takes it again from its record, and
// confirms it; a confirm finds a claim that is not the holder's lost; a
// release gives back only the holder's own.
func TestTheMountClaimRule(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	hostA := transport.MountHolder{Host: "web1", Dir: "/mnt/a", ID: "a1"}
	hostB := transport.MountHolder{Host: "web2", Dir: "/mnt/b", ID: "b2"}
	held := func(h transport.MountHolder, confirmed bool) *mountClaim {
		return &mountClaim{holder: h, epoch: 7, taken: t0, grace: 5 * time.Second, confirmed: confirmed, open: 2, lastOpen: t0}
	}
	req := func(action string, h transport.MountHolder) *transport.ClaimRequest {
		return &transport.ClaimRequest{Volume: "vol0", Action: action, Holder: h, Grace: 5 * time.Second}
	}
	now := t0.Add(time.Minute)
	for _, tc := range []struct {
		name    string
		cur     *mountClaim
		r       *transport.ClaimRequest
		holder  string // the claim's holder after it ("" for none)
		confirm bool
		refused error
		words   []string
	}{
		{name: "no claim: the take is the holder's", r: req(transport.ClaimTake, hostA), holder: "a1"},
		{name: "another holder's claim: the take is refused, naming its host and directory",
			cur: held(hostA, true), r: req(transport.ClaimTake, hostB), holder: "a1", confirm: true, refused: ErrMountClaimed,
			words: []string{"vol0 is mounted already, on host web1 at /mnt/a", "2 NBD connection(s) open", "--force does not change that", "replctl umount /mnt/a, on web1"}},
		{name: "the holder takes it again from its record: renewed, to be confirmed again",
			cur: held(hostA, true), r: req(transport.ClaimTake, hostA), holder: "a1"},
		{name: "the holder confirms", cur: held(hostA, false), r: req(transport.ClaimConfirm, hostA), holder: "a1", confirm: true},
		{name: "a confirm of a claim another holder took: lost",
			cur: held(hostB, false), r: req(transport.ClaimConfirm, hostA), holder: "b2", refused: ErrClaimLost,
			words: []string{"the mount claim of vol0 on host web1 at /mnt/a is not held any more", "held on host web2 at /mnt/b now", "nothing was mounted"}},
		{name: "a confirm with no claim (the primary restarted since the take): lost",
			r: req(transport.ClaimConfirm, hostA), refused: ErrClaimLost, words: []string{"no mount holds it now"}},
		{name: "the holder releases it", cur: held(hostA, true), r: req(transport.ClaimRelease, hostA)},
		{name: "a release by another holder leaves it", cur: held(hostA, true), r: req(transport.ClaimRelease, hostB), holder: "a1", confirm: true},
		{name: "a release with no claim is nothing to do", r: req(transport.ClaimRelease, hostA)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, err := stepClaim(tc.cur, tc.r, now, 7)
			if !errors.Is(err, tc.refused) || (tc.refused == nil) != (err == nil) {
				t.Fatalf("error %v, want %v", err, tc.refused)
			}
			for _, w := range tc.words {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal %q does not say %q", err, w)
				}
			}
			switch {
			case tc.holder == "" && next != nil:
				t.Fatalf("claim %+v after it, want none", next)
			case tc.holder != "" && (next == nil || next.holder.ID != tc.holder || next.confirmed != tc.confirm):
				t.Fatalf("claim %+v after it, want %s's (confirmed %v)", next, tc.holder, tc.confirm)
			}
			if tc.holder == "a1" && tc.r.Action == transport.ClaimTake && tc.cur == nil && (!next.taken.Equal(now) || next.epoch != 7) {
				t.Fatalf("a new claim %+v: want it taken now, at epoch 7", next)
			}
		})
	}
}

// TestAClaimLastsWhileItsConnectionsAreOpenAndGraceAfter: the connections
// made since the claim was taken keep it (not those older); once the last
// one closed it lasts its grace, and one not confirmed yet at least the
// time a mount takes to connect.
func TestAClaimLastsWhileItsConnectionsAreOpenAndGraceAfter(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	before := nbdClient{addr: "10.0.0.9:1", since: t0.Add(-time.Second), export: "vol0"}
	mine := nbdClient{addr: "10.0.0.5:2", since: t0.Add(time.Second), export: "vol0"}
	c := &mountClaim{holder: transport.MountHolder{Host: "h", Dir: "/d", ID: "x"}, taken: t0, grace: 5 * time.Second, confirmed: true, lastOpen: t0}

	c.observe(t0.Add(time.Hour), []nbdClient{before, mine})
	if c.open != 1 || c.lapsed(t0.Add(time.Hour)) {
		t.Fatalf("with its connection open: open %d, lapsed %v; want 1 open, held", c.open, c.lapsed(t0.Add(time.Hour)))
	}
	closed := t0.Add(time.Hour + time.Second)
	c.observe(closed, []nbdClient{before})
	if c.open != 0 {
		t.Fatalf("a connection older than the claim counts as its own")
	}
	if c.lapsed(closed.Add(4 * time.Second)) {
		t.Fatal("the claim lapsed within its grace after its last connection closed")
	}
	if !c.lapsed(closed.Add(6 * time.Second)) {
		t.Fatal("the claim lasts beyond its grace after its last connection closed")
	}
	if got, want := c.lapses(), t0.Add(time.Hour).Add(5*time.Second); !got.Equal(want) {
		t.Fatalf("it lapses at %s, want %s (grace after the last look that saw a connection)", got, want)
	}

	unconfirmed := &mountClaim{taken: t0, grace: 5 * time.Second, lastOpen: t0}
	unconfirmed.observe(t0.Add(time.Minute), nil)
	if unconfirmed.lapsed(t0.Add(time.Minute)) || !unconfirmed.lapsed(t0.Add(claimConfirmWindow+time.Second)) {
		t.Fatalf("a claim not confirmed lapses after %s with no connection, want %s", unconfirmed.window(), claimConfirmWindow)
	}
}

// offsetClock is the time plus an offset a test moves on.
type offsetClock struct{ offset atomic.Int64 }

func (c *offsetClock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *offsetClock) advance(d time.Duration) { c.offset.Add(int64(d)) }
func (c *offsetClock) install(claims *mountClaims) {
	now := c.now
	claims.clock.Store(&now)
}

// TestAVolumeIsMountedOnceAndItsClaimLapsesWithItsConnections: alpha, the
// primary, gives vol0's claim to a mount on web1; a second mount's take is
// refused, naming web1 and its directory, and so is a switchover; beta,
// the secondary, refuses a take, naming alpha. Once the first mount's NBD
// connection is gone the claim lasts its grace (the mount's --io-timeout),
// then lapses: an event says so, and the second mount takes it.
func TestAVolumeIsMountedOnceAndItsClaimLapsesWithItsConnections(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	alpha := c.start("alpha")
	clock := &offsetClock{}
	clock.install(&alpha.claims)
	c.start("beta")
	c.waitInSync()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := transport.MountHolder{Host: "web1", Dir: "/srv/data", ID: "first"}
	second := transport.MountHolder{Host: "web2", Dir: "/srv/other", ID: "second"}
	claim := func(node, action string, h transport.MountHolder) (*transport.ClaimReply, error) {
		return c.nodes[node].api.Claim(ctx, &transport.ClaimRequest{Volume: "vol0", Action: action, Holder: h, Grace: 30 * time.Second})
	}

	if _, err := claim("beta", transport.ClaimTake, first); err == nil || !strings.Contains(err.Error(), "its primary is alpha") {
		t.Fatalf("a take on the secondary beta: %v; want it refused, naming alpha", err)
	}
	if r, err := claim("alpha", transport.ClaimTake, first); err != nil || !r.Held || r.Holder != first {
		t.Fatalf("the first take: %+v, %v", r, err)
	}
	cl, err := nbdtest.Dial(ctx, alpha.NBDAddr(), "vol0")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if r, err := claim("alpha", transport.ClaimConfirm, first); err != nil || r.Connections != 1 {
		t.Fatalf("the confirm with the mount's connection made: %+v, %v; want 1 connection", r, err)
	}
	if _, err := claim("alpha", transport.ClaimTake, second); err == nil || !strings.Contains(err.Error(), "vol0 is mounted already, on host web1 at /srv/data") {
		t.Fatalf("a second mount's take: %v; want it refused, naming web1 and /srv/data", err)
	}
	_, err = alpha.api.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta"})
	if err == nil || !strings.Contains(err.Error(), "vol0 is mounted on host web1 at /srv/data") || !strings.Contains(err.Error(), "replctl umount /srv/data, on web1") {
		t.Fatalf("a switchover while the volume is mounted: %v; want it refused, naming the mount and how to unmount it", err)
	}

	if _, err := cl.Disconnect(); err != nil {
		t.Fatal(err)
	}
	eventually(t, func() bool { return len(alpha.nbdClients("vol0")) == 0 }, "alpha sees the mount's connection gone")
	if _, err := claim("alpha", transport.ClaimTake, second); err == nil || !strings.Contains(err.Error(), "no NBD connection open now: the claim lapses at") {
		t.Fatalf("a second mount's take within the grace: %v; want it refused, saying when the claim lapses", err)
	}
	clock.advance(31 * time.Second)
	eventually(t, func() bool {
		evs, _ := alpha.store.Events(50)
		for _, e := range evs {
			if e.Kind == "mount-claim-ended" && strings.Contains(e.Message, "lapsed: no NBD connection of it was open for 30s") {
				return true
			}
		}
		return false
	}, "an event says the claim lapsed")
	if r, err := claim("alpha", transport.ClaimTake, second); err != nil || r.Holder != second {
		t.Fatalf("a second mount's take after the grace: %+v, %v", r, err)
	}
	if r, err := claim("alpha", transport.ClaimRelease, second); err != nil || r.Held {
		t.Fatalf("the release: %+v, %v", r, err)
	}
}
