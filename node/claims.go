package node

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
)

// Mount claims (issue 27): a volume is mounted at most once. replctl mount
// takes the volume's claim from its primary BEFORE it connects to the
// export, confirms it once its NBD connections are made and BEFORE it
// makes or mounts a file system, and replctl umount gives it back. While
// a claim lasts, another holder's take is refused, naming the holder's
// host and mount point, whatever --force says: two file systems on one
// device destroy each other.
//
// The claim is the primary's, in memory, for the term it was taken in:
//   - It covers the NBD connections made to this node's export since it
//     was taken (while it lasts no other mount connects: NBD carries no
//     client's name, and a connection that is not the holder's keeps the
//     claim, which errs on the side of refusing).
//   - It lasts while one of them is open, and the mount's grace (its
//     --io-timeout) after the last one closed, so that a client host that
//     crashed does not hold the volume for ever. A claim not confirmed
//     yet lasts at least claimConfirmWindow, the time a mount may take to
//     connect.
//   - A switchover is refused while it lasts (clientsError), naming the
//     mount, unless the mount follows the primary (MountHolder.Follows)
//     and every connection open is its own: the demotion drains them and
//     its helper takes the claim again at the new primary. A failover, a demotion or a restart of this node ends the
//     term, and with it every connection the claim covers, for good:
//     replctl mount's client never reconnects (to this node or another)
//     and the old primary is fenced by the epoch. So the claim ends with
//     the term, and the new primary starts with none: its on_promote
//     mounts the volume at once. Nothing of it is written to disk or to
//     raft, since nothing it protects survives what would lose it.

// Bounds of a claim.
const (
	// claimDefaultGrace is a claim's grace when the mount gives none
	// (--io-timeout 0: its client waits for ever).
	claimDefaultGrace = time.Minute
	// claimConfirmWindow is how long a claim lasts at least before it is
	// confirmed: a mount's helper may take a minute to connect.
	claimConfirmWindow = 2 * time.Minute
	// claimWatchEvery is how often the primary looks at the connections
	// of its claims, while it has any.
	claimWatchEvery = 250 * time.Millisecond
)

// ErrMountClaimed: the volume is mounted already (another holder's claim
// lasts).
var ErrMountClaimed = errors.New("the volume is mounted already")

// ErrClaimLost: a confirm found the claim no longer the holder's.
var ErrClaimLost = errors.New("the mount claim is not held any more")

// mountClaim is one volume's claim. Its methods are pure: the owner
// (mountClaims) gives them the time and the connections it sees.
type mountClaim struct {
	holder transport.MountHolder
	// epoch is the volume's term the claim was taken in.
	epoch uint64
	// taken: the connections that entered transmission since are the
	// holder's.
	taken time.Time
	grace time.Duration
	// confirmed: the holder said its connections are made.
	confirmed bool
	// open is how many of the holder's connections were open at the last
	// look, lastOpen the last look that saw one (taken until then).
	open     int
	lastOpen time.Time
}

// observe counts the holder's connections among clients, the export's, at
// now.
func (c *mountClaim) observe(now time.Time, clients []nbdClient) {
	c.open = 0
	for _, cl := range clients {
		if !cl.since.Before(c.taken) {
			c.open++
		}
	}
	if c.open > 0 {
		c.lastOpen = now
	}
}

// window is how long the claim lasts once no connection is open.
func (c *mountClaim) window() time.Duration {
	if c.confirmed {
		return c.grace
	}
	return max(c.grace, claimConfirmWindow)
}

// lapses is when the claim ends if no connection opens (zero while one is
// open).
func (c *mountClaim) lapses() time.Time {
	if c.open > 0 {
		return time.Time{}
	}
	return c.lastOpen.Add(c.window())
}

// lapsed says whether the claim has ended at now (as observe last saw it).
func (c *mountClaim) lapsed(now time.Time) bool {
	return c.open == 0 && now.Sub(c.lastOpen) > c.window()
}

// stepClaim is the rule of a claim request: the claim after it (nil: none)
// or the refusal. cur is the volume's claim in force at now (nil: none; an
// ended or lapsed one was dropped), epoch the primary's term.
func stepClaim(cur *mountClaim, r *transport.ClaimRequest, now time.Time, epoch uint64) (*mountClaim, error) {
	grace := r.Grace
	if grace <= 0 {
		grace = claimDefaultGrace
	}
	mine := cur != nil && cur.holder.ID == r.Holder.ID
	switch r.Action {
	case transport.ClaimTake:
		switch {
		case cur == nil:
			return &mountClaim{holder: r.Holder, epoch: epoch, taken: now, grace: grace, lastOpen: now}, nil
		case mine:
			// The same mount again (made from its record): renewed, to be
			// confirmed again; its connections still count from taken.
			next := *cur
			next.holder, next.grace, next.confirmed, next.lastOpen = r.Holder, grace, false, now
			return &next, nil
		}
		return cur, &claimedError{volume: r.Volume, claim: *cur, now: now}
	case transport.ClaimConfirm:
		if !mine {
			lost := &lostError{volume: r.Volume, holder: r.Holder}
			if cur != nil {
				lost.heldBy = cur.holder
			}
			return cur, lost
		}
		next := *cur
		next.confirmed, next.lastOpen = true, now
		return &next, nil
	case transport.ClaimRelease:
		if mine {
			return nil, nil
		}
		return cur, nil
	}
	return cur, fmt.Errorf("claim action %q: want %s, %s or %s", r.Action, transport.ClaimTake, transport.ClaimConfirm, transport.ClaimRelease)
}

// mountedWords say where a claim's mount is: "on host H at DIR".
func mountedWords(h transport.MountHolder) string {
	return fmt.Sprintf("on host %s at %s", h.Host, h.Dir)
}

// umountWords say how to end a claim's mount.
func umountWords(h transport.MountHolder) string {
	return fmt.Sprintf("replctl umount %s, on %s", h.Dir, h.Host)
}

// claimedError refuses a take: another holder's claim lasts.
type claimedError struct {
	volume string
	claim  mountClaim
	now    time.Time
}

func (e *claimedError) Error() string {
	c := e.claim
	conns := fmt.Sprintf("%d NBD connection(s) open", c.open)
	if c.open == 0 {
		conns = fmt.Sprintf("no NBD connection open now: the claim lapses at %s, %s after its last one closed, if none opens",
			c.lapses().UTC().Format(time.TimeOnly), c.window())
	}
	return fmt.Sprintf("%s is mounted already, %s (replctl mount since %s UTC, %s): a volume is mounted at most once, and --force does not change that; unmount it there first (%s), then run replctl mount again",
		e.volume, mountedWords(c.holder), c.taken.UTC().Format(time.TimeOnly), conns, umountWords(c.holder))
}

func (e *claimedError) Unwrap() error { return ErrMountClaimed }

// lostError refuses a confirm: the claim is no longer the holder's.
type lostError struct {
	volume string
	holder transport.MountHolder
	// heldBy holds it now (zero: nobody).
	heldBy transport.MountHolder
}

func (e *lostError) Error() string {
	now := "no mount holds it now"
	if e.heldBy != (transport.MountHolder{}) {
		now = "it is held " + mountedWords(e.heldBy) + " now"
	}
	return fmt.Sprintf("the mount claim of %s %s is not held any more (it lapsed while the mount connected, or the primary restarted or changed): %s; nothing was mounted, run replctl mount again",
		e.volume, mountedWords(e.holder), now)
}

func (e *lostError) Unwrap() error { return ErrClaimLost }

// mountClaims are a node's claims, by volume. mu is a leaf (doc.go).
type mountClaims struct {
	mu       mutex
	byVolume map[string]*mountClaim
	// wake tells the watch loop a claim was taken (buffered, one).
	wake chan struct{}
	// base is the node's clock. clock, when set, replaces its Now (tests);
	// a claim's connections are counted by the NBD server's time of their
	// handshake, so a test's clock may run ahead of it, never behind.
	base  clock.Clock
	clock atomic.Pointer[func() time.Time]
}

func (c *mountClaims) now() time.Time {
	if f := c.clock.Load(); f != nil {
		return (*f)()
	}
	return c.base.Now()
}

// primaryTerm is the volume's epoch and whether this node is its primary,
// or else the primary's name.
func (v *Volume) primaryTerm() (epoch uint64, primary bool, primaryName string) {
	s := v.state()
	return s.st.Durable.Epoch, s.role() == replication.Primary, s.st.Durable.Primary
}

// inForce is the volume's claim at now, as the term and the connections
// say, dropping one that ended or lapsed (and saying why in an event
// line); nil when there is none. Call with c.mu held.
func (c *mountClaims) inForceLocked(volume string, now time.Time, epoch uint64, primary bool, clients []nbdClient) (*mountClaim, string) {
	cur := c.byVolume[volume]
	if cur == nil {
		return nil, ""
	}
	cur.observe(now, clients)
	why := ""
	switch {
	case !primary || cur.epoch != epoch:
		why = fmt.Sprintf("the mount claim of %s %s ended with the primary's term (epoch %d)", volume, mountedWords(cur.holder), cur.epoch)
	case cur.lapsed(now):
		why = fmt.Sprintf("the mount claim of %s %s lapsed: no NBD connection of it was open for %s", volume, mountedWords(cur.holder), cur.window())
	default:
		return cur, ""
	}
	delete(c.byVolume, volume)
	return nil, why
}

// claim runs a claim request on this node (control.Node's Claim).
func (n *Node) claim(r *transport.ClaimRequest) (*transport.ClaimReply, error) {
	v, err := n.volume(r.Volume)
	if err != nil {
		return nil, err
	}
	epoch, primary, primaryName := v.primaryTerm()
	if !primary && r.Action != transport.ClaimRelease {
		where := "it has no primary now"
		if primaryName != "" && primaryName != n.name {
			where = "its primary is " + primaryName
		}
		return nil, fmt.Errorf("%s is not primary on %s (%s): its mount claim is the primary's; run replctl mount with --addr at the primary", r.Volume, n.name, where)
	}
	clients := n.nbdClients(r.Volume)
	now := n.claims.now()
	reply := &transport.ClaimReply{Volume: r.Volume, Node: n.name, Epoch: epoch}
	released := ""
	n.claims.mu.Lock()
	cur, ended := n.claims.inForceLocked(r.Volume, now, epoch, primary, clients)
	next, err := stepClaim(cur, r, now, epoch)
	switch {
	case err != nil:
	case next == nil:
		delete(n.claims.byVolume, r.Volume)
		if cur != nil {
			released = fmt.Sprintf("%s released by the mount %s (replctl umount)", r.Volume, mountedWords(cur.holder))
		}
	default:
		if n.claims.byVolume == nil {
			n.claims.byVolume = map[string]*mountClaim{}
		}
		n.claims.byVolume[r.Volume] = next
		reply.Held, reply.Holder, reply.Taken, reply.Connections = true, next.holder, next.taken, next.open
	}
	n.claims.mu.Unlock()
	if ended != "" {
		n.log.Info(ended, "volume", r.Volume)
		n.event(r.Volume, "mount-claim-ended", ended)
	}
	if err != nil {
		n.log.Info("mount claim refused", "volume", r.Volume, "action", r.Action, "host", r.Holder.Host, "dir", r.Holder.Dir, "why", err)
		return nil, err
	}
	switch {
	case r.Action == transport.ClaimTake:
		n.event(r.Volume, "mount-claimed", fmt.Sprintf("%s claimed for a mount %s (replctl mount)", r.Volume, mountedWords(r.Holder)))
		select {
		case n.claims.wake <- struct{}{}:
		default:
		}
	case released != "":
		n.event(r.Volume, "mount-released", released)
	}
	return reply, nil
}

// mountClaimOf is a copy of the volume's claim in force, nil when none;
// clients are the export's connections now.
func (n *Node) mountClaimOf(v *Volume, clients []nbdClient) *mountClaim {
	epoch, primary, _ := v.primaryTerm()
	now := n.claims.now()
	n.claims.mu.Lock()
	cur, ended := n.claims.inForceLocked(v.name, now, epoch, primary, clients)
	var out *mountClaim
	if cur != nil {
		c := *cur
		out = &c
	}
	n.claims.mu.Unlock()
	if ended != "" {
		n.log.Info(ended, "volume", v.name)
		n.event(v.name, "mount-claim-ended", ended)
	}
	return out
}

// watchClaims looks at the connections of the node's claims every
// claimWatchEvery while it has any, so that a claim lapses its grace after
// its last connection closed; with none it waits for one. It ends when
// stop is closed.
func (n *Node) watchClaims(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-n.claims.wake:
		}
		for n.lookAtClaims() {
			t := n.clock.NewTimer(claimWatchEvery)
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C():
			}
		}
	}
}

// lookAtClaims observes every claim, drops those that ended or lapsed, and
// says whether any is left.
func (n *Node) lookAtClaims() bool {
	n.claims.mu.Lock()
	names := make([]string, 0, len(n.claims.byVolume))
	for name := range n.claims.byVolume {
		names = append(names, name)
	}
	n.claims.mu.Unlock()
	if len(names) == 0 {
		return false
	}
	sort.Strings(names)
	byExport := map[string][]nbdClient{}
	for _, c := range n.nbdClients("") {
		byExport[c.export] = append(byExport[c.export], c)
	}
	vols := n.volumes()
	left := false
	for _, name := range names {
		var epoch uint64
		primary := false
		if v, ok := vols[name]; ok {
			epoch, primary, _ = v.primaryTerm()
		}
		n.claims.mu.Lock()
		cur, ended := n.claims.inForceLocked(name, n.claims.now(), epoch, primary, byExport[name])
		n.claims.mu.Unlock()
		left = left || cur != nil
		if ended != "" {
			n.log.Info(ended, "volume", name)
			n.event(name, "mount-claim-ended", ended)
		}
	}
	return left
}

// clientWordsFor says what uses the volume's export here: the mount that
// holds its claim (where, and how to unmount it) and the NBD clients.
// Empty when nothing does. With followersMayStay (a switchover), a mount
// that follows the primary (MountHolder.Follows) whose claim covers every
// connection open to the export keeps nothing from happening: the
// demotion drains its requests (the server answers NBD_ESHUTDOWN) and its
// helper sends them again to the new primary.
func (n *Node) clientWordsFor(v *Volume, followersMayStay bool) string {
	clients := n.nbdClients(v.name)
	held := n.mountClaimOf(v, clients)
	if len(clients) == 0 && held == nil {
		return ""
	}
	if followersMayStay && held != nil && held.holder.Follows {
		mine := true
		for _, c := range clients {
			if c.since.Before(held.taken) {
				mine = false // a client from before the claim: not the mount's
			}
		}
		if mine {
			return ""
		}
	}
	var list []string
	for _, c := range clients {
		list = append(list, fmt.Sprintf("%s (connected since %s)", c.addr, c.since.UTC().Format(time.RFC3339)))
	}
	sort.Strings(list)
	if held == nil {
		return fmt.Sprintf("%d NBD client(s) of %s on %s: %s; unmount the file system and disconnect them (replctl umount DIR on %s, nbd-client -d, or stop nbdfuse/qemu) first",
			len(clients), v.name, n.name, strings.Join(list, ", "), n.name)
	}
	conns := "no NBD connection open now"
	if len(clients) > 0 {
		conns = fmt.Sprintf("%d NBD connection(s) on %s: %s", len(clients), n.name, strings.Join(list, ", "))
	}
	return fmt.Sprintf("%s is mounted %s (replctl mount; %s); unmount it first: %s",
		v.name, mountedWords(held.holder), conns, umountWords(held.holder))
}
