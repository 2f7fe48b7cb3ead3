package cluster

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/lockorder"
)

// gossip runs memberlist for one node. Memberlist calls the delegate
// methods below with its own locks held (NotifyJoin, NotifyLeave and
// NotifyUpdate under its nodeLock): they only record the event under mu,
// a leaf lock never held while calling memberlist, and signal Changed
// without blocking. Everything that calls memberlist runs in run's
// goroutine or in the caller's, never in a callback.
type gossip struct {
	self    string
	t       Timing
	clock   clock.Clock // the rejoin ticks and the members' since
	logger  *hclogger
	changed func() // must not block
	// voter reports whether a name is a voter of raft's latest
	// configuration; it must not block (memberlist's lock is held).
	voter func(name string) bool
	list  *memberlist.Memberlist

	mu      lockorder.Mutex
	members map[string]Member // whom to gossip with: the cluster file, AddVoter
	// refused are the names NotifyAlive refused; one that becomes a
	// voter is fetched again (admitRefused).
	refused map[string]bool
	seen    map[string]seenNode
	meta    []byte
	// metaDirty asks run to gossip a new meta.
	metaDirty chan struct{}
}

type seenNode struct {
	state Liveness
	since time.Time
	meta  []byte
}

func startGossip(self Member, members []Member, t Timing, key []byte, logger *hclogger, changed func(), voter func(string) bool, clk clock.Clock) (*gossip, error) {
	g := &gossip{
		self: self.Name, t: t, clock: clk, logger: logger, changed: changed, voter: voter,
		members:   map[string]Member{},
		refused:   map[string]bool{},
		seen:      map[string]seenNode{},
		metaDirty: make(chan struct{}, 1),
	}
	for _, m := range members {
		g.members[m.Name] = m
	}
	host, portText, err := net.SplitHostPort(self.Gossip)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, fmt.Errorf("gossip port %q: %w", portText, err)
	}
	if host == "" {
		host = "0.0.0.0"
	} else if net.ParseIP(host) == nil { // memberlist binds IPs only
		ip, err := net.ResolveIPAddr("ip", host)
		if err != nil {
			return nil, fmt.Errorf("gossip address %q: %w", self.Gossip, err)
		}
		host = ip.String()
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = self.Name
	mc.Label = "replvol"
	mc.BindAddr, mc.BindPort, mc.AdvertisePort = host, port, port
	mc.ProbeInterval, mc.ProbeTimeout = t.ProbeInterval, t.ProbeTimeout
	mc.SuspicionMult, mc.SuspicionMaxTimeoutMult = t.SuspicionMult, 2
	mc.GossipInterval = t.ProbeInterval / 2
	mc.TCPTimeout = 5 * t.ProbeInterval
	mc.PushPullInterval = 15 * time.Second
	// A node that comes back with another address (a replaced machine) is
	// accepted once it has been dead this long.
	mc.DeadNodeReclaimTime = 10 * time.Second
	mc.Delegate, mc.Events, mc.Alive = g, g, g
	if len(key) > 0 {
		// Every message and push/pull encrypted and authenticated with
		// the cluster's key (AES-GCM): one that does not decrypt is
		// dropped, so a node without the key is no member.
		mc.SecretKey = slices.Clone(key)
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	mc.Logger = log.New(logger.StandardWriter(nil), "", 0)
	if g.list, err = memberlist.Create(mc); err != nil {
		return nil, fmt.Errorf("start gossip on %s: %w", self.Gossip, err)
	}
	return g, nil
}

// run joins the members it does not see alive, now and every
// RejoinInterval (memberlist does not reconnect after a partition by
// itself), and gossips new metadata. It returns when ctx ends.
func (g *gossip) run(ctx context.Context) {
	tick := g.clock.NewTicker(g.t.RejoinInterval)
	defer tick.Stop()
	g.rejoin()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
			g.rejoin()
			g.admitRefused()
		case <-g.metaDirty:
			if err := g.list.UpdateNode(g.t.RejoinInterval); err != nil {
				g.logger.Debug("gossip the node's metadata", "err", err)
			}
		}
	}
}

func (g *gossip) rejoin() {
	var addrs []string
	g.mu.Lock()
	for name, m := range g.members {
		if name != g.self && g.seen[name].state != Alive {
			addrs = append(addrs, m.Gossip)
		}
	}
	g.mu.Unlock()
	g.join(addrs, "gossip: join")
}

// join joins the gossip of the nodes at addrs (none: nothing to do),
// logging a failure at debug level under what.
func (g *gossip) join(addrs []string, what string) {
	if len(addrs) == 0 {
		return
	}
	slices.Sort(addrs)
	if n, err := g.list.Join(addrs); err != nil {
		g.logger.Debug(what, "addresses", addrs, "reached", n, "err", err)
	}
}

// admitRefused fetches the state of the nodes alive again (a push/pull)
// once a name NotifyAlive refused has become a voter: a node added at
// runtime, in no cluster file of this node's, whose announcements came
// before raft told this node it is a voter; the leader, which gossips
// with it from the AddVoter on, tells of it.
func (g *gossip) admitRefused() {
	var addrs []string
	g.mu.Lock()
	admitted := false
	for name := range g.refused {
		if g.voter != nil && g.voter(name) {
			delete(g.refused, name)
			admitted = true
		}
	}
	if admitted {
		for name, m := range g.members {
			if name != g.self && g.seen[name].state == Alive {
				addrs = append(addrs, m.Gossip)
			}
		}
	}
	g.mu.Unlock()
	g.join(addrs, "gossip: fetch the state of the nodes alive for a new voter")
}

func (g *gossip) add(m Member) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.members[m.Name] = m
}

func (g *gossip) remove(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.members, name)
}

// memberNames returns the names of the nodes it gossips with (this one
// included), sorted.
func (g *gossip) memberNames() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	names := make([]string, 0, len(g.members))
	for name := range g.members {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// setMeta stores this node's metadata and has run gossip it.
func (g *gossip) setMeta(b []byte) error {
	if len(b) > memberlist.MetaMaxSize {
		return fmt.Errorf("gossip metadata of %d bytes: memberlist takes at most %d", len(b), memberlist.MetaMaxSize)
	}
	g.mu.Lock()
	g.meta = slices.Clone(b)
	g.mu.Unlock()
	select {
	case g.metaDirty <- struct{}{}:
	default:
	}
	return nil
}

// states returns every member of the cluster file and every node gossip
// told of, by name.
func (g *gossip) states() []MemberState {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []MemberState
	for name, m := range g.members {
		s := g.seen[name]
		out = append(out, MemberState{Name: name, State: s.state, Since: s.since, Witness: m.Witness, Meta: slices.Clone(s.meta)})
	}
	for name, s := range g.seen {
		if _, ok := g.members[name]; !ok {
			out = append(out, MemberState{Name: name, State: s.state, Since: s.since, Meta: slices.Clone(s.meta)})
		}
	}
	for i := range out {
		if out[i].State == "" {
			out[i].State = Unknown
		}
	}
	slices.SortFunc(out, func(a, b MemberState) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

func (g *gossip) shutdown() error { return g.list.Shutdown() }

// record notes what memberlist told of n; called under memberlist's lock.
func (g *gossip) record(n *memberlist.Node, state Liveness) {
	g.mu.Lock()
	s := g.seen[n.Name]
	if s.state != state {
		s.state, s.since = state, g.clock.Now()
	}
	s.meta = slices.Clone(n.Meta)
	g.seen[n.Name] = s
	g.mu.Unlock()
	g.changed()
}

// memberlist.EventDelegate: under memberlist's nodeLock; record only.

func (g *gossip) NotifyJoin(n *memberlist.Node)   { g.record(n, Alive) }
func (g *gossip) NotifyUpdate(n *memberlist.Node) { g.record(n, Alive) }
func (g *gossip) NotifyLeave(n *memberlist.Node) {
	if n.State == memberlist.StateLeft {
		g.record(n, Left)
	} else {
		g.record(n, Dead)
	}
}

// NotifyAlive (memberlist.AliveDelegate, under memberlist's nodeLock)
// takes a node gossip tells of only if it is one of the cluster's: of
// this node's cluster file, added at runtime, or a voter of raft's
// configuration. Gossip binds no name to a certificate (its messages are
// sealed with one key every node holds, and name their sender
// themselves), so this is all that can be bound: a holder of the key can
// still speak for any of the cluster's nodes, which is why gossip decides
// nothing on its own (node/failover's watch: a primary that renews is not lost,
// whatever gossip says; the metadata is only shown). memberlist logs the
// refusal (StandardWriter: once per name and cause). A node added at
// runtime that is in no cluster file of this node's is taken once raft
// made it a voter (admitRefused).
func (g *gossip) NotifyAlive(n *memberlist.Node) error {
	if n.Name == g.self {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.members[n.Name]; ok || (g.voter != nil && g.voter(n.Name)) {
		return nil
	}
	if len(g.refused) < maxRefusalsKept {
		g.refused[n.Name] = true
	}
	return fmt.Errorf("%q is no node of this cluster (of its cluster file, added at runtime, or a raft voter): gossip counts only the cluster's nodes", n.Name)
}

// memberlist.Delegate: only the metadata is used.

func (g *gossip) NodeMeta(limit int) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.meta) > limit {
		return nil // setMeta refuses more; never reached
	}
	return slices.Clone(g.meta)
}

func (g *gossip) NotifyMsg([]byte)                  {}
func (g *gossip) GetBroadcasts(_, _ int) [][]byte   { return nil }
func (g *gossip) LocalState(bool) []byte            { return nil }
func (g *gossip) MergeRemoteState(_ []byte, _ bool) {}
