package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/internal/logonce"
	"github.com/replvol/replvol/metadata/raftlog"
	"github.com/replvol/replvol/replication"
)

// Cluster is one node's membership in the cluster and its copy of the
// authority. Open starts it; Close stops it.
type Cluster struct {
	cfg    Config // with Timing defaults
	self   string
	logger *slog.Logger
	// raftTime is the clock raft keeps, the real one (hashicorp/raft
	// takes none): its LastContact is a time of it, so the age of a
	// contact, and the times compared with one (membership's since), are
	// read on it, never on cfg.Clock.
	raftTime clock.Clock

	store *raftlog.RaftStore
	fsm   *fsm
	raft  *raft.Raft
	// observer tells of every leader change (followers included).
	observer *raft.Observer
	gossip   *gossip
	// tls is raft's TLS stream layer (nil without Config.TLS).
	tls *tlsLayer
	// trans is raft's transport, which checks each inbound RPC's sender.
	trans        *gatedTransport
	leases       *leases
	renewer      renewer
	barriers     sharedBarrier
	leaderChange *broadcast
	// leaderless is when this node last lost sight of a leader (zero
	// while it sees one), on raftTime.
	leaderless leaderlessSince
	// member is what this node learned of its own standing in raft
	// (membership.go).
	member membership

	changed chan struct{}
	// forwardRefusals: a refused forwarded request is logged once per
	// sender and kind.
	forwardRefusals *logonce.Set

	ctx       context.Context // ends at Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Open starts this node's raft and gossip. A node without raft state
// bootstraps with every member as a voter (unless NoBootstrap); one with
// state resumes from its raft log and latest snapshot. The Cluster owns
// cfg.RaftListener from now on, also when Open fails.
func Open(cfg Config) (_ *Cluster, err error) {
	if cfg.RaftListener != nil {
		defer func() {
			if err != nil {
				_ = cfg.RaftListener.Close()
			}
		}()
	}
	cfg.Timing = cfg.Timing.withDefaults()
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	self, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger.With("cluster", cfg.Self)
	ctx, cancel := context.WithCancel(context.Background())
	// c, not the result: the undo below, and the goroutines started
	// before a later step fails, use it after a return sets the result
	// to nil.
	c := &Cluster{
		cfg: cfg, self: cfg.Self, logger: logger, raftTime: clock.Real(),
		leases:          newLeases(cfg.Timing),
		leaderChange:    newBroadcast(),
		changed:         make(chan struct{}, 1),
		forwardRefusals: logonce.New(refusalQuiet, maxRefusalsKept, nil),
		ctx:             ctx, cancel: cancel,
	}
	c.leaderless.lost(c.raftTime.Now()) // none is known before the first election
	c.fsm = &fsm{applied: c.signalChanged}
	var undo []func()
	defer func() {
		if err != nil {
			cancel()
			for _, f := range slices.Backward(undo) {
				f()
			}
		}
	}()

	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("cluster state directory: %w", err)
	}
	if c.store, err = raftlog.OpenRaftStore(filepath.Join(cfg.Dir, "raft.db")); err != nil {
		return nil, err
	}
	undo = append(undo, func() { _ = c.store.Close() })
	hcl := newHclogger(logger, "raft")
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, 2, hcl.Named("snapshots"))
	if err != nil {
		return nil, fmt.Errorf("raft snapshots: %w", err)
	}
	raw, err := newStreamLayer(cfg.RaftListener, self.Raft)
	if err != nil {
		return nil, err
	}
	var stream raft.StreamLayer = raw
	if cfg.TLS != nil {
		c.tls = newTLSLayer(raw, cfg.TLS, cfg.Members, cfg.Timing.RaftIOTimeout, logger, cfg.Refused, cfg.Clock)
		stream = c.tls
	}
	// Every inbound RPC is checked against its connection's certificate
	// and raft's voters before raft sees it (rpcgate.go).
	trans := newGatedTransport(gateConfig{
		listener: stream, withTLS: cfg.TLS != nil, members: cfg.Members,
		timeout: cfg.Timing.RaftIOTimeout, logger: logger, hcl: hcl.Named("net"), refused: cfg.Refused, clock: cfg.Clock,
	})
	c.trans = trans
	undo = append(undo, func() { _ = trans.Close() })

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.Self)
	rc.HeartbeatTimeout = cfg.Timing.HeartbeatTimeout
	rc.ElectionTimeout = cfg.Timing.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.Timing.LeaderLeaseTimeout
	rc.Logger = hcl
	// Unbuffered: raft waits until watchRaft took the news before it acts
	// as leader (the lease argument in lease.go needs that).
	notify := make(chan bool)
	rc.NotifyCh = notify
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("raft config: %w", err)
	}
	has, err := raft.HasExistingState(c.store, c.store, snaps)
	if err != nil {
		return nil, fmt.Errorf("raft state: %w", err)
	}
	if !has && !cfg.NoBootstrap {
		var servers []raft.Server
		for _, m := range cfg.Members {
			servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(m.Name), Address: raft.ServerAddress(m.Raft)})
		}
		if err := raft.BootstrapCluster(rc, c.store, c.store, snaps, trans, raft.Configuration{Servers: servers}); err != nil {
			return nil, fmt.Errorf("raft bootstrap: %w", err)
		}
	}
	observations := make(chan raft.Observation, 16)
	c.observer = raft.NewObserver(observations, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	if c.raft, err = raft.NewRaft(rc, c.fsm, c.store, c.store, snaps, trans); err != nil {
		return nil, fmt.Errorf("start raft: %w", err)
	}
	c.raft.RegisterObserver(c.observer)
	trans.start(func() (raft.Configuration, string, bool) {
		f := c.raft.GetConfiguration()
		if f.Error() != nil {
			return raft.Configuration{}, "", false
		}
		_, leader := c.raft.LeaderWithID()
		return f.Configuration(), string(leader), true
	})
	undo = append(undo, func() {
		c.raft.DeregisterObserver(c.observer)
		_ = c.raft.Shutdown().Error()
	})
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.watchRaft(notify, observations)
	}()
	undo = append(undo, c.wg.Wait) // after cancel, before the shutdown

	if c.gossip, err = startGossip(self, cfg.Members, cfg.Timing, cfg.GossipKey, newHclogger(logger, "gossip"), c.signalChanged, c.isVoter, cfg.Clock); err != nil {
		return nil, err
	}
	c.wg.Add(2)
	go func() {
		defer c.wg.Done()
		c.gossip.run(ctx)
	}()
	go func() {
		defer c.wg.Done()
		c.watchMembership(ctx)
	}()
	return c, nil
}

// Close stops raft and gossip at once, as a crash would (no leadership
// transfer, no gossip leave: the others detect the loss), and closes the
// raft store. Proposals in flight end with ErrClosed or ErrOutcomeUnknown.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		c.cancel()
		errGossip := c.gossip.shutdown()
		c.raft.DeregisterObserver(c.observer)
		errRaft := c.raft.Shutdown().Error() // closes the transport and its listener
		c.wg.Wait()
		c.closeErr = errors.Join(errGossip, errRaft, c.store.Close())
	})
	return c.closeErr
}

// watchRaft follows leadership: this node's (NotifyCh) for the leases,
// everybody's (observations) for the waiters of waitLeader.
func (c *Cluster) watchRaft(notify <-chan bool, observations <-chan raft.Observation) {
	for {
		select {
		case <-c.ctx.Done():
			return
		case leader := <-notify:
			c.leases.setLeader(leader, c.cfg.Clock.Now())
			c.logger.Info("raft leadership", "leader", leader)
		case o := <-observations:
			if lo, ok := o.Data.(raft.LeaderObservation); ok {
				if lo.LeaderID == "" {
					c.leaderless.lost(c.raftTime.Now())
				} else {
					c.leaderless.found()
				}
			}
		}
		c.leaderChange.fire()
		c.signalChanged()
	}
}

// LeaderChanged returns a channel that is closed at the next leader
// change this node sees (any number of watchers may wait on it).
func (c *Cluster) LeaderChanged() <-chan struct{} { return c.leaderChange.wait() }

// Changed is signalled after each state machine change, each gossip event
// and each leader change. Signals coalesce (one buffered slot, never
// blocking); one consumer reads it, then reads what it needs.
func (c *Cluster) Changed() <-chan struct{} { return c.changed }

func (c *Cluster) signalChanged() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// Authority returns a copy of this node's state machine. It may lag the
// leader's by the entries not yet applied here.
func (c *Cluster) Authority() replication.Authority { return c.fsm.authority().Clone() }

// AuthorityAt returns a copy of this node's state machine and the raft
// index of the last entry it applied: the state is that of the log up to
// there (raft's own AppliedIndex runs ahead of the state machine).
func (c *Cluster) AuthorityAt() (replication.Authority, uint64) {
	a, index := c.fsm.authorityAt()
	return a.Clone(), index
}

// SetMeta sets the metadata this node gossips (per-volume disk states,
// say). memberlist carries at most memberlist.MetaMaxSize (512) bytes; a
// larger b is refused. Others see it within a few gossip rounds.
func (c *Cluster) SetMeta(b []byte) error { return c.gossip.setMeta(b) }

// Status returns the cluster as this node sees it.
func (c *Cluster) Status() Status {
	_, id := c.raft.LeaderWithID()
	s := Status{Self: c.self, Leader: string(id)}
	switch {
	case s.Leader == "":
		now := c.raftTime.Now()
		s.Electing = now.Sub(c.leaderless.lost(now)) < c.cfg.Timing.ElectionGrace()
	case c.raft.State() == raft.Leader:
		s.Quorum = s.Leader == c.self
	default:
		lost := c.raft.LastContact().Add(c.cfg.Timing.HeartbeatTimeout)
		s.Quorum = c.raftTime.Now().Before(lost)
		s.Electing = !s.Quorum && c.raftTime.Since(lost) < c.cfg.Timing.ElectionGrace()
	}
	voterSet := map[string]bool{}
	if f := c.raft.GetConfiguration(); f.Error() == nil {
		for _, srv := range f.Configuration().Servers {
			if srv.Suffrage == raft.Voter {
				s.Voters = append(s.Voters, string(srv.ID))
				voterSet[string(srv.ID)] = true
			}
		}
	}
	slices.Sort(s.Voters)
	if standing, voters, _ := c.member.get(); standing != "" {
		s.Leader, s.Quorum, s.Electing, s.Voters = "", false, false, voters
		s.Standing, s.NotAVoter = standing, standingText(c.self, standing, voters)
		clear(voterSet)
		for _, v := range voters {
			voterSet[v] = true
		}
	}
	s.Members = c.gossip.states()
	for i := range s.Members {
		s.Members[i].Voter = voterSet[s.Members[i].Name]
	}
	return s
}

// HasLeader reports whether a raft leader with a quorum answers this node
// now: it leads, or the leader's last contact is within the heartbeat
// timeout. Without one, its state machine may be behind raft's.
func (c *Cluster) HasLeader() bool { return c.hasLeader(time.Time{}) }

// ElectionGrace is how long this node calls a spell without a leader
// with a quorum an election under way (Timing.ElectionGrace).
func (c *Cluster) ElectionGrace() time.Duration { return c.cfg.Timing.ElectionGrace() }

// AwaitQuorum returns true once this node sees a leader with a quorum,
// waiting at most as long as raft takes to replace a lost leader (two
// heartbeat and election timeouts), or until ctx ends. A quorum that is
// only between leaders (the old one just died, the election runs) is
// seen; one that cannot form is not waited for.
func (c *Cluster) AwaitQuorum(ctx context.Context) bool {
	if c.Status().Quorum {
		return true
	}
	t := c.cfg.Timing
	ctx, cancel := context.WithTimeout(ctx, 2*(t.HeartbeatTimeout+t.ElectionTimeout))
	defer cancel()
	for {
		// Taken before the look: a heartbeat or a leader change after it
		// wakes this loop.
		contact, changed := c.trans.contact.wait(), c.leaderChange.wait()
		if _, err := c.waitLeader(ctx); err != nil {
			return false
		}
		if c.Status().Quorum {
			return true
		}
		// A leader named but not heard from lately: look again at its
		// next heartbeat, or when another leader is named.
		select {
		case <-contact:
		case <-changed:
		case <-ctx.Done():
			return false
		case <-c.ctx.Done():
			return false
		}
	}
}

// waitLeader returns the leader's name once one is known, or ErrNoQuorum
// when ctx ends first.
func (c *Cluster) waitLeader(ctx context.Context) (string, error) {
	return c.waitForLeader(ctx, func(id string) bool { return id != "" })
}

// waitLeaderOtherThan waits until this node sees a leader change away
// from old.
func (c *Cluster) waitLeaderOtherThan(ctx context.Context, old string) error {
	_, err := c.waitForLeader(ctx, func(id string) bool { return id != old })
	return err
}

func (c *Cluster) waitForLeader(ctx context.Context, ok func(id string) bool) (string, error) {
	for {
		changed := c.leaderChange.wait()
		if err := c.NotAVoter(); err != nil {
			return "", err
		}
		if _, id := c.raft.LeaderWithID(); ok(string(id)) {
			return string(id), nil
		}
		// Raft sets its leader BEFORE it tells the observer, and the
		// observer drops an event only while its channel is full: the
		// events queued then fire changed after the dropped change, so
		// the look after them sees it. No timer is needed.
		select {
		case <-changed:
		case <-ctx.Done():
			return "", fmt.Errorf("%w: %w", ErrNoQuorum, ctx.Err())
		case <-c.ctx.Done():
			return "", ErrClosed
		}
	}
}

// leaderlessSince holds when this node lost sight of a leader; nil while
// it sees one. watchRaft notes raft's leader observations; Status notes
// a loss it sees first (the observation is still on its way). A find
// that raft dropped (its channel full) keeps the older loss, which errs
// on the side of a warning.
type leaderlessSince struct{ at atomic.Pointer[time.Time] }

// lost notes a leader lost at now, unless one was lost before and not
// found since, and returns when it was lost.
func (l *leaderlessSince) lost(now time.Time) time.Time {
	if l.at.CompareAndSwap(nil, &now) {
		return now
	}
	if p := l.at.Load(); p != nil {
		return *p
	}
	return now // found meanwhile
}

func (l *leaderlessSince) found() { l.at.Store(nil) }

// broadcast wakes every waiter at once: wait returns a channel that the
// next fire closes.
type broadcast struct {
	mu lockorder.Mutex
	ch chan struct{}
}

func newBroadcast() *broadcast { return &broadcast{ch: make(chan struct{})} }

func (b *broadcast) wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

func (b *broadcast) fire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.ch)
	b.ch = make(chan struct{})
}

// streamLayer is raft's TCP stream: the given listener (or one on the
// advertised address), dialling through the listener when it can.
type streamLayer struct {
	net.Listener
	advertise net.Addr
	dial      func(raft.ServerAddress, time.Duration) (net.Conn, error)
}

func newStreamLayer(ln net.Listener, advertise string) (*streamLayer, error) {
	addr, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		return nil, fmt.Errorf("raft address %q: %w", advertise, err)
	}
	if ln == nil {
		if ln, err = net.Listen("tcp", advertise); err != nil {
			return nil, fmt.Errorf("raft listener: %w", err)
		}
	}
	s := &streamLayer{Listener: ln, advertise: addr}
	if d, ok := ln.(raft.StreamLayer); ok {
		s.dial = d.Dial
	} else {
		s.dial = func(a raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
			return net.DialTimeout("tcp", string(a), timeout)
		}
	}
	return s, nil
}

func (s *streamLayer) Addr() net.Addr { return s.advertise }

func (s *streamLayer) Dial(a raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return s.dial(a, timeout)
}

// addMember has this node gossip with m, and know m's raft address: a
// member added at runtime (AddVoter).
func (c *Cluster) addMember(m Member) {
	c.gossip.add(m)
	c.trans.learn(m)
	if c.tls != nil {
		c.tls.learn(m)
	}
}

// TransferLeadership hands raft's leadership from this node, which must
// lead, to the voter named to (raft's LeadershipTransferToServer). The
// node layer moves it off a data primary: a leader that dies with the
// primary costs a failover an election and a new leader's wait for the
// old lease.
func (c *Cluster) TransferLeadership(ctx context.Context, to string) error {
	var addr string
	if f := c.raft.GetConfiguration(); f.Error() == nil {
		for _, srv := range f.Configuration().Servers {
			if string(srv.ID) == to {
				addr = string(srv.Address)
			}
		}
	}
	if addr == "" {
		return fmt.Errorf("transfer leadership to %s: not a voter", to)
	}
	return c.waitFuture(ctx, c.raft.LeadershipTransferToServer(raft.ServerID(to), raft.ServerAddress(addr)))
}

// isVoter reports whether name is a voter of raft's latest configuration
// (read without waiting on raft).
func (c *Cluster) isVoter(name string) bool {
	f := c.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) == name && srv.Suffrage == raft.Voter {
			return true
		}
	}
	return false
}
