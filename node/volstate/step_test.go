package volstate

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/replvol/replvol/replication"
)

// The transcripts in testdata each pin one property of Step; each file
// opens with it. A transcript runs several nodes' state machines by name
// (node=a): an event from another modelled node takes that node's
// generations, role and epoch, so a handshake reads as it happens.
//
//	init node=a peers=b,c primary=a epoch=2 gen=g1 [history=g0] [bitmap=b:g0] [auth] [fresh] [crashed]
//	step node=a EVENT [args]     Step; prints the Ready and the state
//	apply node=a EVENT [fail]    Apply with a write that fails or not
//
// A step or an apply takes the facts the driver reads when it steps
// (Peer.InSync, Peer.Marked, State.LocalMissing) from its arguments:
// in-sync=PEERS (else every peer Connected, not tracked in a bitmap and
// with no bits, as node reads its peers), bits=PEERS (their bitmaps hold
// bits), local-missing.
//
//	io node=a now=MS             what an IO request meets at MS
//	state node=a                 the state
func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &harness{nodes: map[string]*State{}}
		datadriven.RunTest(t, path, h.run)
	})
}

type harness struct {
	nodes map[string]*State
}

var base = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// gen is the generation named name (its bytes, zero padded).
func gen(name string) replication.Generation {
	var g replication.Generation
	if name == "" || name == "0" {
		return g
	}
	copy(g[:], name)
	return g
}

func genName(g replication.Generation) string {
	if g.IsZero() {
		return "0"
	}
	return strings.TrimRight(string(g[:]), "\x00")
}

func arg(d *datadriven.TestData, key string) (string, bool) {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			return strings.Join(a.Vals, ","), true
		}
	}
	return "", false
}

func argOr(d *datadriven.TestData, key, def string) string {
	if v, ok := arg(d, key); ok {
		return v
	}
	return def
}

func argUint(t *testing.T, d *datadriven.TestData, key string) uint64 {
	v, ok := arg(d, key)
	if !ok {
		return 0
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s: %s=%s: %v", d.Pos, key, v, err)
	}
	return n
}

func argTime(t *testing.T, d *datadriven.TestData, key string) time.Time {
	return base.Add(time.Duration(argUint(t, d, key)) * time.Millisecond)
}

func list(v string) []string {
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

func (h *harness) node(t *testing.T, d *datadriven.TestData) *State {
	name := argOr(d, "node", "")
	s, ok := h.nodes[name]
	if !ok {
		t.Fatalf("%s: no node %q", d.Pos, name)
	}
	return s
}

func (h *harness) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "init":
		return h.init(t, d)
	case "state":
		return format(*h.node(t, d))
	case "io":
		return Admit(*h.node(t, d), argTime(t, d, "now")).String()
	case "step", "apply":
		s := h.node(t, d)
		if len(d.CmdArgs) < 2 {
			t.Fatalf("%s: %s needs an event", d.Pos, d.Cmd)
		}
		facts(d, s)
		e := h.event(t, d, s)
		var b strings.Builder
		if d.Cmd == "step" {
			next, rd := Step(*s, e)
			b.WriteString(formatReady(rd))
			if rd.Err == nil {
				*s = next
			}
		} else {
			_, fail := arg(d, "fail")
			var wrote Ready
			next, acts, err := Apply(*s, e, func(prep []Action) error {
				for _, a := range prep {
					fmt.Fprintf(&b, "prepare: %s\n", a)
				}
				return nil
			}, func(rd Ready, _ State) error {
				wrote = rd
				if fail {
					return errors.New("injected write error")
				}
				return nil
			})
			if wrote.needsWrite() {
				b.WriteString("wrote: " + formatWrite(wrote))
				if fail {
					b.WriteString(" (failed)")
				}
				b.WriteString("\n")
			}
			for _, a := range acts {
				fmt.Fprintf(&b, "action: %s\n", a)
			}
			if err != nil {
				fmt.Fprintf(&b, "err: %v\n", err)
			}
			*s = next
		}
		b.WriteString(format(*s))
		return b.String()
	}
	t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	return ""
}

func (h *harness) init(t *testing.T, d *datadriven.TestData) string {
	name := argOr(d, "node", "")
	s := State{Self: name, Peers: map[string]Peer{}, Disk: replication.Consistent}
	for _, p := range list(argOr(d, "peers", "")) {
		s.Peers[p] = Peer{Repl: replication.Connecting}
	}
	s.Durable.Epoch = argUint(t, d, "epoch")
	s.Durable.Primary = argOr(d, "primary", "")
	s.Durable.Gens.Current = gen(argOr(d, "gen", ""))
	s.Durable.Gens.History = make([]replication.Generation, replication.HistorySlots)
	for i, g := range list(argOr(d, "history", "")) {
		s.Durable.Gens.History[i] = gen(g)
	}
	for _, kv := range list(argOr(d, "bitmap", "")) {
		p, g, _ := strings.Cut(kv, ":")
		if s.Durable.Gens.Bitmaps == nil {
			s.Durable.Gens.Bitmaps = map[string]replication.Generation{}
		}
		s.Durable.Gens.Bitmaps[p] = gen(g)
	}
	_, s.Auth = arg(d, "auth")
	_, s.Fresh = arg(d, "fresh")
	_, s.CrashedPrimary = arg(d, "crashed")
	_, s.Durable.LocalStale = arg(d, "local-stale")
	s.Disk = s.IdleDisk()
	h.nodes[name] = &s
	return format(s)
}

// facts sets in s the facts of a step command (see TestTranscripts).
func facts(d *datadriven.TestData, s *State) {
	bits := list(argOr(d, "bits", ""))
	inSync, given := arg(d, "in-sync")
	for name, p := range s.Peers {
		p.Marked = slices.Contains(bits, name)
		if given {
			p.InSync = slices.Contains(list(inSync), name)
		} else {
			p.InSync = p.Repl == replication.Connected && !s.Durable.Gens.Tracking(name) && !p.Marked
		}
		s.Peers[name] = p
	}
	_, s.LocalMissing = arg(d, "local-missing")
}

// event builds the event of a step command; what a modelled peer would
// send is taken from its state.
func (h *harness) event(t *testing.T, d *datadriven.TestData, s *State) Event {
	kind := d.CmdArgs[1].Key
	peerName := argOr(d, "peer", argOr(d, "from", ""))
	other, modelled := h.nodes[peerName]
	uuids := func() replication.UUIDSet {
		if modelled {
			return other.UUIDs(s.Self)
		}
		u := replication.UUIDSet{Current: gen(argOr(d, "their-gen", "")), History: make([]replication.Generation, replication.HistorySlots)}
		for i, g := range list(argOr(d, "their-history", "")) {
			u.History[i] = gen(g)
		}
		u.Bitmap = gen(argOr(d, "their-bitmap", ""))
		return u
	}
	session := argUint(t, d, "session")
	switch kind {
	case "opened":
		return Opened{}
	case "start":
		return Started{}
	case "resync-started":
		return ResyncStarted{Peer: peerName, From: gen(argOr(d, "from-gen", ""))}
	case "replica-write-failed":
		return ReplicaWriteFailed{}
	case "incoming-ended":
		return IncomingEnded{}
	case "split-brain-found":
		return SplitBrainFound{Peer: peerName, Rule: argOr(d, "rule", "")}
	case "peer-connected":
		e := PeerConnected{Peer: peerName, Session: session, UUIDs: uuids(), PeerDisk: replication.DiskState(argOr(d, "their-disk", "Consistent")),
			NextGen: gen(argOr(d, "next", "")), PeerEpoch: argUint(t, d, "their-epoch")}
		_, e.Marked = arg(d, "marked")
		_, e.PeerPrimary = arg(d, "their-primary")
		_, e.PeerOutdated = arg(d, "their-outdated")
		if modelled {
			e.PeerPrimary, e.PeerEpoch, e.PeerDisk = other.Role() == replication.Primary, other.Durable.Epoch, other.Disk
			e.DiscardFrom = other.Discard
		}
		return e
	case "peer-answered":
		e := PeerAnswered{Peer: peerName}
		_, e.Pulling = arg(d, "pulling")
		return e
	case "primary-reached":
		e := PrimaryReached{From: peerName, Epoch: argUint(t, d, "epoch"), UUIDs: uuids()}
		_, e.HandedOver = arg(d, "handed-over")
		_, e.Misdirected = arg(d, "misdirected")
		_, e.SizeDiffers = arg(d, "size-differs")
		if modelled {
			e.Epoch = other.Durable.Epoch
		}
		return e
	case "newer-primary":
		return NewerPrimary{Epoch: argUint(t, d, "epoch")}
	case "peer-lost":
		return PeerLost{Peer: peerName, Session: session}
	case "link-started":
		return LinkStarted{Peer: peerName}
	case "link-down":
		e := LinkDown{Peer: peerName}
		_, e.ForGood = arg(d, "for-good")
		return e
	case "peer-congested":
		return PeerCongested{Peer: peerName, Session: session}
	case "peer-drained":
		e := PeerDrained{Peer: peerName, Session: session}
		_, e.Resyncing = arg(d, "resyncing")
		return e
	case "peer-catching-up":
		return PeerCatchingUp{Peer: peerName, Session: session}
	case "peer-in-sync":
		return PeerInSync{Peer: peerName, Session: session}
	case "authority":
		_, unknown := arg(d, "unknown")
		_, failover := arg(d, "failover")
		return AuthorityChanged{Known: !unknown, Primary: argOr(d, "primary", ""), Epoch: argUint(t, d, "epoch"), Now: argTime(t, d, "now"), Failover: failover}
	case "lease-renewed":
		return LeaseRenewed{Epoch: argUint(t, d, "epoch"), Until: argTime(t, d, "until")}
	case "disk-failed":
		return DiskFailed{}
	case "attach-failed":
		return AttachFailed{}
	case "disk-works":
		return DiskWorks{}
	case "local-resync-finished":
		return LocalResyncFinished{}
	case "write-missed":
		e := WriteMissed{Peer: peerName, Held: gen(argOr(d, "held", "")), Next: gen(argOr(d, "next", "")), MayHold: gen(argOr(d, "may-hold", ""))}
		_, e.Behind = arg(d, "behind")
		return e
	case "resync-finished":
		// As source: the peer's stream and this node's generation,
		// unless session= or gen= name others.
		e := ResyncFinished{Peer: peerName, Session: s.Peers[peerName].Session, Current: s.Durable.Gens.Current}
		if _, ok := arg(d, "session"); ok {
			e.Session = session
		}
		if g, ok := arg(d, "gen"); ok {
			e.Current = gen(g)
		}
		_, e.AsTarget = arg(d, "target")
		_, e.OwnHistory = arg(d, "own-history")
		if e.AsTarget {
			u := uuids()
			e.Session, e.Current = 0, u.Current
			if !e.OwnHistory {
				e.History = u.History
			}
		}
		return e
	case "quiesced":
		return Quiesced{}
	case "handed-over":
		return HandedOver{}
	case "handover-aborted":
		return HandoverAborted{}
	case "promote":
		return Promote{Epoch: argUint(t, d, "epoch"), Gen: gen(argOr(d, "gen", "")), Now: argTime(t, d, "now")}
	case "retake":
		e := Retake{Epoch: argUint(t, d, "epoch"), Gen: gen(argOr(d, "gen", ""))}
		if p, ok := arg(d, "raft-primary"); ok {
			e.AuthorityKnown, e.AuthorityPrimary, e.AuthorityEpoch = true, p, argUint(t, d, "raft-epoch")
		}
		return e
	case "force":
		return Force{Now: argTime(t, d, "now"), NewGen: gen(argOr(d, "next", "")), AuthorityEpoch: argUint(t, d, "raft-epoch")}
	case "demote":
		return Demote{To: argOr(d, "to", "")}
	case "discard-my-data":
		return DiscardMyData{}
	case "disconnect":
		return Disconnect{}
	case "connect":
		return Connect{}
	case "stop":
		_, removed := arg(d, "removed")
		return Stop{Removed: removed}
	}
	t.Fatalf("%s: unknown event %q", d.Pos, kind)
	return nil
}

func formatGens(g replication.Generations) string {
	var b strings.Builder
	fmt.Fprintf(&b, "current=%s", genName(g.Current))
	if len(g.Bitmaps) > 0 {
		var bm []string
		for p, x := range g.Bitmaps {
			bm = append(bm, p+":"+genName(x))
		}
		sort.Strings(bm)
		fmt.Fprintf(&b, " bitmaps=%s", strings.Join(bm, ","))
	}
	var hist []string
	for _, x := range g.History {
		if !x.IsZero() {
			hist = append(hist, genName(x))
		}
	}
	if len(hist) > 0 {
		fmt.Fprintf(&b, " history=%s", strings.Join(hist, ","))
	}
	return b.String()
}

func formatDurable(d Durable) string {
	out := fmt.Sprintf("epoch=%d primary=%s %s", d.Epoch, orDash(d.Primary), formatGens(d.Gens))
	if !d.SyncGen.IsZero() {
		out += " syncgen=" + genName(d.SyncGen)
	}
	if d.LocalStale {
		out += " local-stale"
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func formatWrite(rd Ready) string {
	var parts []string
	if rd.Indicator == SetIndicator {
		parts = append(parts, "set-indicator")
	}
	if rd.Persist != nil {
		parts = append(parts, formatDurable(*rd.Persist))
	}
	return strings.Join(parts, " then ")
}

func formatReady(rd Ready) string {
	var b strings.Builder
	if rd.Err != nil {
		fmt.Fprintf(&b, "refused: %v\n", rd.Err)
		return b.String()
	}
	for _, a := range rd.Prepare {
		fmt.Fprintf(&b, "prepare: %s\n", a)
	}
	if rd.needsWrite() {
		b.WriteString("write: " + formatWrite(rd) + "\n")
	}
	for _, a := range rd.Actions {
		fmt.Fprintf(&b, "action: %s\n", a)
	}
	return b.String()
}

func format(s State) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s %s disk=%s", s.Self, s.Role(), s.Serving, s.Disk)
	if s.Why != CauseNone {
		fmt.Fprintf(&b, " why=%s", s.Why)
	}
	fmt.Fprintf(&b, " %s\n", formatDurable(s.Durable))
	var peers []string
	for name, p := range s.Peers {
		x := name + ":" + string(p.Repl)
		if p.SplitBrainRule != "" {
			x += "(split-brain " + p.SplitBrainRule + ")"
		}
		if p.Pulling {
			x += "(pulling)"
		}
		peers = append(peers, x)
	}
	sort.Strings(peers)
	fmt.Fprintf(&b, "  peers: %s", strings.Join(peers, " "))
	var flags []string
	if s.Pending != nil {
		flags = append(flags, fmt.Sprintf("pending=%s", s.Pending.Kind))
	}
	if s.Discard {
		flags = append(flags, "discard")
	}
	if s.CrashedPrimary {
		flags = append(flags, "crashed-primary")
	}
	if s.KnownEpoch > 0 {
		flags = append(flags, fmt.Sprintf("known-epoch=%d", s.KnownEpoch))
	}
	if s.LeaseEpoch > 0 {
		until := "none"
		if !s.LeaseUntil.IsZero() {
			until = s.LeaseUntil.Sub(base).String()
		}
		flags = append(flags, fmt.Sprintf("lease=%d until=%s", s.LeaseEpoch, until))
	}
	if s.AdminDown {
		flags = append(flags, "admin-down")
	}
	if len(flags) > 0 {
		fmt.Fprintf(&b, "\n  %s", strings.Join(flags, " "))
	}
	return b.String() + "\n"
}
