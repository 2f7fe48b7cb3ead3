package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/internal/human"
	"github.com/replvol/replvol/node/cluster"
	"github.com/replvol/replvol/node/volstate"
	"github.com/replvol/replvol/replication"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Cluster membership decides the primary (DESIGN.md §5). With raft and
// gossip addresses in the config every node runs a node/cluster.Cluster:
// raft's state machine names each volume's primary and epoch and the data
// nodes known UpToDate or Outdated; memberlist says who is alive. Where a
// majority survives the loss of any one node (three voters or more, a
// witness counts) and failover is not off, a volume is in authority mode:
//
//   - its primary completes reads and writes only while it holds a lease
//     renewed through the raft majority; without one its IO freezes (it
//     is not failed) until the lease is renewed or another node takes over;
//   - a write a peer did not acknowledge completes only after raft
//     committed that peer as Outdated, and a peer becomes UpToDate in raft
//     only once its resync finished, so an Outdated node is never promoted
//     by itself;
//   - the raft leader promotes an UpToDate, alive node when the primary is
//     lost, once no lease of the old primary can still be valid;
//   - every node follows the state machine: a node named primary at a
//     newer epoch takes over (and runs on_promote), a primary that is no
//     longer named stops its IO at once and steps down (and runs
//     on_demote).
//
// With two voters and no witness the cluster runs (status shows the leader
// and why failover is off) and primaries change as without raft.

// clusterTick is how often the node looks at the cluster when nothing
// signalled a change.
const clusterTick = 250 * time.Millisecond

// defaultLeaseDuration is the primary's lease: a lost primary is replaced
// about this long after its last renewal.
const defaultLeaseDuration = 600 * time.Millisecond

// clusterState is a clustered node's part.
type clusterState struct {
	c *cluster.Cluster
	// auto: authority mode, from the config at start (leases, raft
	// records the primaries); why says why not. Automatic failover also
	// needs three live voters: failoverNow.
	auto bool
	why  string
	// lease is the primary's lease duration.
	lease time.Duration
	// clock is the cluster's (Cluster.Clock): the cluster loop's steps,
	// the renewals' pace and the primary's check of its lease keep the
	// time its leases are granted in.
	clock clock.Clock

	// watch follows clusterLoop's steps (it owns it): time this node did
	// not observe (a pause of its process) is not held against a primary.
	watch cluster.Watch

	mu mutex
	// leadingSince: when this node last became leader (zero when not).
	leadingSince time.Time
	// termSeen: per volume, the primary's term (epoch) this node last
	// saw and since when (cluster.Decision.Seen): a new primary is given
	// cluster.StarvedAfter from then to renew its first lease.
	termSeen map[string]cluster.Term
	// promoting: volumes with a failover proposal in flight.
	promoting map[string]bool
	// failoverWhy: per volume, why the leader does not fail over now.
	failoverWhy map[string]string
}

// openCluster starts raft and gossip when the config has their addresses.
func (n *Node) openCluster(dir string, opts Options) error {
	if !n.config().Clustered() {
		return nil
	}
	var members []cluster.Member
	for _, nc := range n.config().Nodes {
		members = append(members, cluster.Member{Name: nc.Name, Raft: nc.Raft, Gossip: nc.Gossip, Witness: nc.IsWitness()})
	}
	timing := opts.ClusterTiming
	if timing.LeaseDuration == 0 {
		timing.LeaseDuration = defaultLeaseDuration
	}
	c, err := cluster.Open(cluster.Config{
		Self: n.name, Members: members, Dir: filepath.Join(dir, "raft"),
		Logger: n.log.With("part", "cluster"), RaftListener: opts.Raft,
		Forward: n.forward, Timing: timing, NoBootstrap: opts.Join,
		TLS: n.tls, GossipKey: n.gossipKey, Refused: n.raftRefused, Clock: n.clock,
	})
	if err != nil {
		return fmt.Errorf("node %s: cluster: %w", n.name, err)
	}
	auto, why := n.config().FailoverMode()
	n.cl = &clusterState{c: c, auto: auto, why: why, lease: timing.LeaseDuration, clock: c.Clock(), watch: cluster.Watch{Every: clusterTick},
		promoting: map[string]bool{}, failoverWhy: map[string]string{}, termSeen: map[string]cluster.Term{}}
	// The volumes took auto when they were opened (New).
	return nil
}

// forward carries a cluster request to another node's control API.
func (n *Node) forward(ctx context.Context, to string, req cluster.ForwardRequest) (cluster.ForwardReply, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return cluster.ForwardReply{}, err
	}
	api, err := n.peerAPI(to)
	if err != nil {
		return cluster.ForwardReply{}, err
	}
	resp, err := api.ClusterForward(ctx, &transport.ClusterMessage{Body: body})
	if err != nil {
		return cluster.ForwardReply{}, err
	}
	var reply cluster.ForwardReply
	if err := json.Unmarshal(resp.Body, &reply); err != nil {
		return cluster.ForwardReply{}, fmt.Errorf("reply of %s: %w", to, err)
	}
	return reply, nil
}

// clusterMessage handles a cluster message another node forwarded (the
// control API's ClusterForward), once sender let it through.
func (n *Node) clusterMessage(ctx context.Context, body []byte, sender func(from string) error) ([]byte, error) {
	if n.cl == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "node %s runs no cluster (no raft/gossip addresses in its config)", n.name)
	}
	var req cluster.ForwardRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "cluster message: %v", err)
	}
	if err := sender(req.From); err != nil {
		return nil, err
	}
	return json.Marshal(n.cl.c.HandleForward(ctx, req))
}

// membership adds or removes a raft voter (the control API's Membership).
func (n *Node) membership(ctx context.Context, r *transport.MembershipRequest) (*transport.MembershipReply, error) {
	if n.cl == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "node %s runs no cluster (no raft/gossip addresses in its config)", n.name)
	}
	if err := n.cl.c.NotAVoter(); err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	if r.Node == "" {
		return nil, status.Error(codes.InvalidArgument, "no node named: give the name of the node to add or remove (replctl status lists the voters)")
	}
	// The voters as the leader committed them: this node may learn of
	// the change only at the leader's next heartbeat.
	var voters []string
	var err error
	if r.Remove {
		// Raft removes a server it does not have without a word: a
		// misspelt name would look removed.
		if now := n.cl.c.Status().Voters; !slices.Contains(now, r.Node) {
			return nil, status.Errorf(codes.NotFound, "%q is not a raft voter, so there is nothing to remove: the voters are %s", r.Node, strings.Join(now, ", "))
		}
		if voters, err = n.cl.c.RemoveVoter(ctx, r.Node); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "remove voter %s: %v", r.Node, err)
		}
	} else {
		nc, ok := n.config().Node(r.Node)
		if !ok {
			return nil, status.Errorf(codes.NotFound, "node %q is not in the config: add it to every node's config file first", r.Node)
		}
		m := cluster.Member{Name: nc.Name, Raft: nc.Raft, Gossip: nc.Gossip, Witness: nc.IsWitness()}
		if voters, err = n.cl.c.AddVoter(ctx, m); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "add voter %s: %v", r.Node, err)
		}
	}
	if len(voters) == 0 {
		voters = n.cl.c.Status().Voters
	}
	return &transport.MembershipReply{Voters: voters}, nil
}

// clusterLoop follows the authority: each volume held here does what the
// state machine says, and the leader fails over volumes whose primary is
// lost.
func (n *Node) clusterLoop(stop <-chan struct{}) {
	tick := n.cl.clock.NewTicker(clusterTick)
	defer tick.Stop()
	var meta []byte
	for {
		select {
		case <-stop:
			return
		case <-n.cl.c.Changed():
		case <-tick.C():
		}
		// One clock reading per step: if the process pauses within the
		// step, what it decides holds for that moment.
		now := n.cl.clock.Now()
		office := n.cl.c.LeadingSince()
		observing, gap := n.cl.watch.Step(now, office)
		switch {
		case gap > 0 && !observing.IsZero():
			n.log.Warn("the cluster loop did not run for a while (the process was paused, starved of CPU, or the loop was busy): the primaries' lease renewals are watched afresh from now",
				"gap", gap.Round(time.Millisecond))
		case gap > 0:
			n.log.Debug("the cluster loop did not run for a while", "gap", gap.Round(time.Millisecond))
		}
		auth := n.cl.c.Authority()
		st := n.cl.c.Status()
		n.kickCreated()
		for _, v := range n.volumes() {
			va, ok := auth.Volume(v.name)
			v.followAuthority(va, ok)
		}
		if m := n.gossipMeta(); string(m) != string(meta) {
			if err := n.cl.c.SetMeta(m); err == nil {
				meta = m
			}
		}
		n.cl.mu.Lock()
		switch {
		case st.Leader != n.name:
			n.cl.leadingSince = time.Time{}
		case n.cl.leadingSince.IsZero():
			n.cl.leadingSince = now
		}
		leading := n.cl.leadingSince
		n.cl.mu.Unlock()
		d := n.decide(auth, st, office, observing, leading, now)
		n.failover(d)
		if d.HandOff != "" {
			n.handOff(d.HandOff, now)
		}
	}
}

// decide gathers what the leader knows at now and asks cluster.Decide
// what to fail over: the volumes of the config, raft's authority (auth)
// and status (st), the leases granted here, this node's office, since
// when it observes (Watch.Step) and settles (leading), the terms it saw,
// and whether it serves as a primary.
func (n *Node) decide(auth replication.Authority, st cluster.Status, office, observing, leading, now time.Time) cluster.Decision {
	volumes := n.config().Volumes
	names := make([]string, 0, len(volumes))
	renewals := cluster.Renewals{Lease: n.cl.lease, Volumes: make(map[string]cluster.Renewal, len(volumes))}
	for _, vc := range volumes {
		names = append(names, vc.Name)
		last, renewing := n.cl.c.LeaseWatch(vc.Name)
		renewals.Volumes[vc.Name] = cluster.Renewal{Last: last, Renewing: renewing}
	}
	n.cl.mu.Lock()
	terms := maps.Clone(n.cl.termSeen)
	n.cl.mu.Unlock()
	primaryHere := false
	for _, v := range n.volumes() {
		primaryHere = primaryHere || v.state().role() == replication.Primary
	}
	leader := cluster.Leader{Office: office, Observing: observing, Failover: n.cl.failoverConfig(), Terms: terms,
		Settling: leading, PrimaryHere: primaryHere}
	return cluster.Decide(names, auth, st, renewals, leader, now)
}

// failoverConfig is the config's failover mode, fixed at start.
func (cs *clusterState) failoverConfig() cluster.FailoverConfig {
	return cluster.FailoverConfig{Auto: cs.auto, Why: cs.why}
}

// handOff hands raft's leadership to the voter to, as cluster.Decide
// says (a leader that serves as a primary).
func (n *Node) handOff(to string, now time.Time) {
	n.cl.mu.Lock()
	n.cl.leadingSince = now // try again no sooner than cluster.LeadershipSettle
	n.cl.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := n.cl.c.TransferLeadership(ctx, to); err != nil {
		n.log.Debug("hand raft leadership off this primary", "to", to, "err", err)
		return
	}
	n.log.Info("raft leadership handed off this primary", "to", to)
}

// gossipMeta is what this node gossips: each volume's disk state here.
func (n *Node) gossipMeta() []byte {
	disks := map[string]string{}
	for name, v := range n.volumes() {
		disks[name] = string(v.state().st.Disk)
	}
	b, _ := json.Marshal(disks)
	if len(b) > 512 {
		return nil
	}
	return b
}

// failover carries out the leader's decision (cluster.Decide): it says
// in status why volumes are not failed over, and proposes each failover
// once at a time, in the office it was decided in. The promotion itself
// waits (in the cluster) until no lease of the old primary can still be
// valid, and is dropped if that office ends meanwhile.
func (n *Node) failover(d cluster.Decision) {
	if d.Off != 0 {
		n.clearFailoverWhy() // only a failing-over leader's reasons hold
		return
	}
	n.cl.mu.Lock()
	maps.Copy(n.cl.termSeen, d.Seen)
	n.cl.mu.Unlock()
	for _, l := range d.Left {
		n.setFailoverWhy(l.Volume, l.Status())
	}
	for _, p := range d.Proposals {
		n.cl.mu.Lock()
		busy := n.cl.promoting[p.Volume]
		n.cl.promoting[p.Volume] = true
		n.cl.mu.Unlock()
		if busy {
			continue
		}
		n.setFailoverWhy(p.Volume, p.Status())
		n.wg.Add(1)
		go func(p cluster.Proposal) {
			defer n.wg.Done()
			defer func() {
				n.cl.mu.Lock()
				delete(n.cl.promoting, p.Volume)
				n.cl.mu.Unlock()
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			began := n.clock.Now()
			nva, err := n.cl.c.ProposeAsLeader(ctx, p.Command(n.clock.Now().UTC()), p.Office)
			if err != nil {
				n.log.Warn("failover proposal failed", "volume", p.Volume, "to", p.To, "err", err)
				return
			}
			n.log.Warn("failover: promoted", "volume", p.Volume, "from", p.From, "to", nva.Primary, "epoch", nva.Epoch, "waited", n.clock.Since(began), "why", p.Lost())
			n.event(p.Volume, "failover", fmt.Sprintf("%s %s: %s promoted at epoch %d (raft leader %s)", p.From, p.Lost(), nva.Primary, nva.Epoch, n.name))
		}(p)
	}
}

func (n *Node) clearFailoverWhy() {
	n.cl.mu.Lock()
	defer n.cl.mu.Unlock()
	clear(n.cl.failoverWhy)
}

func (n *Node) setFailoverWhy(volume, why string) {
	n.cl.mu.Lock()
	defer n.cl.mu.Unlock()
	n.cl.failoverWhy[volume] = why
}

// clusterInfo is the cluster section of the status.
func (n *Node) clusterInfo() (transport.ClusterInfo, map[string]string) {
	if n.cl == nil {
		_, why := n.config().FailoverMode()
		return transport.ClusterInfo{Failover: "off", Reason: why}, nil
	}
	st := n.cl.c.Status()
	auto, why := cluster.FailoverNow(st, n.cl.failoverConfig())
	info := transport.ClusterInfo{Leader: st.Leader, Quorum: st.Quorum, Electing: st.Electing, Voters: st.Voters, Failover: "off", Reason: why, Standing: string(st.Standing)}
	if auto {
		info.Failover = "auto"
		switch {
		case st.Electing:
			info.Reason = "electing a raft leader: the last one handed its office on or was lost moments ago"
		case !st.Quorum:
			info.Reason = "no quorum: no raft leader with a majority is in reach; primaries hold their IO when their lease runs out, and nobody is promoted"
		}
	}
	info.Reason = human.Join(info.Reason, n.failoverReasons())
	membership := map[string]string{}
	for _, m := range st.Members {
		membership[m.Name] = string(m.State)
	}
	return info, membership
}

// --- a volume in authority mode ---

// authorityState is what a volume in authority mode keeps of its lease
// and of the cluster's records, beside its state (st.Auth says the
// cluster decides the primary; st.LeaseUntil is how long this primary may
// complete IO, in the term st.LeaseEpoch). A primary forced without a
// quorum serves without a lease (serving OpenWithoutLease) until raft
// records it. Its fields are guarded by the volume's v.mu: its methods
// are called with v.mu held.
type authorityState struct {
	// leaseWake is closed when st.LeaseUntil changes, and when the
	// renewals stop; leaseStop ends the renewals of the term leaseLoop.
	leaseWake chan struct{}
	leaseStop context.CancelFunc
	leaseLoop uint64
	// outdated: peers raft has recorded Outdated at this epoch.
	// upToDate: the proposals that raft record a peer UpToDate again, in
	// flight (closed when done); ensureOutdated waits for one before it
	// records the peer Outdated, so that the two land in that order.
	// forgets counts the times outdated entries were forgotten: a record
	// made across one is not cached.
	outdated map[string]uint64
	upToDate map[string]chan struct{}
	forgets  uint64
}

// renewingLocked reports whether the lease renewals of the term epoch run.
func (a *authorityState) renewingLocked(epoch uint64) bool {
	return a.leaseLoop == epoch && a.leaseStop != nil
}

// wakeLeaseWaitersLocked wakes IO waiting for the lease.
func (a *authorityState) wakeLeaseWaitersLocked() {
	if a.leaseWake != nil {
		close(a.leaseWake)
	}
	a.leaseWake = make(chan struct{})
}

// leaseWaitLocked returns what wakeLeaseWaitersLocked closes next.
func (a *authorityState) leaseWaitLocked() <-chan struct{} {
	if a.leaseWake == nil {
		a.leaseWake = make(chan struct{})
	}
	return a.leaseWake
}

// forgetLocked forgets that raft recorded peer Outdated.
func (a *authorityState) forgetLocked(peer string) {
	delete(a.outdated, peer)
	a.forgets++
}

// forgetAllLocked forgets every Outdated record.
func (a *authorityState) forgetAllLocked() {
	clear(a.outdated)
	a.forgets++
}

// followAuthority makes the volume do what the cluster's state machine
// says (va, or nothing yet when !ok).
func (v *Volume) followAuthority(va replication.VolumeAuthority, ok bool) {
	v.mu.Lock()
	role, epoch, primary, auth := v.roleLocked(), v.st.Durable.Epoch, v.st.Durable.Primary, v.st.Auth
	v.mu.Unlock()
	if !ok {
		// Nobody registered the volume yet: its primary does, with the
		// epoch it holds.
		if role == replication.Primary {
			v.proposeOnce("init", replication.InitCommand(v.name, v.self, epoch, v.dataNodes()))
		}
		return
	}
	if !auth {
		return
	}
	v.mu.Lock()
	exempt := v.st.Serving == volstate.OpenWithoutLease
	v.mu.Unlock()
	switch {
	case exempt && role == replication.Primary && va.Epoch < epoch:
		// Forced to primary without a quorum: now that raft answers, it
		// records this node (at the epoch after its own).
		v.proposeOnce("reclaim", replication.FailoverCommand(v.name, va.Epoch, v.self, true, v.clock.Now().UTC(), "forced by the operator while raft had no quorum"))
	case va.Primary == v.self && va.Epoch > epoch:
		v.background("take-over", func() { v.takeOverAt(va.Epoch, va.FailedOverAt(va.Epoch)) })
	case va.Primary == v.self && va.Epoch == epoch && primary == v.self:
		v.confirmed(va.Epoch)
	case va.Primary != v.self && role == replication.Primary && va.Epoch >= epoch:
		v.background("step-down", func() { v.yieldTo(va.Primary, va.Epoch) })
	case va.Primary != v.self && va.Epoch > epoch:
		v.background("adopt-epoch", func() { v.adoptEpoch(va.Primary, va.Epoch, va.FailedOverAt(va.Epoch)) })
	}
	if role == replication.Primary && va.Primary == v.self {
		// Peers in sync that the state machine does not know UpToDate yet.
		for _, p := range v.streamingPeers() {
			if p.inSync() && !va.IsUpToDate(p.name) {
				v.proposeUpToDate(p.name, va.Epoch)
			}
		}
	}
}

// dataNodes lists the volume's nodes, sorted.
func (v *Volume) dataNodes() []string {
	var nodes []string
	for name := range v.cfg.Disks {
		nodes = append(nodes, name)
	}
	sort.Strings(nodes)
	return nodes
}

// background runs f once at a time per kind, and reports whether it
// started it: not while one of its kind runs, nor once the volume stops.
func (v *Volume) background(kind string, f func()) bool {
	v.mu.Lock()
	if v.tasks == nil {
		v.tasks = map[string]bool{}
	}
	if v.tasks[kind] || isClosed(v.stopping) {
		// Nothing starts on a volume that is shutting down (a cluster
		// step may still hold a volume just removed).
		v.mu.Unlock()
		return false
	}
	v.tasks[kind] = true
	v.mu.Unlock()
	v.bg.Add(1)
	go func() {
		defer v.bg.Done()
		defer func() {
			v.mu.Lock()
			delete(v.tasks, kind)
			v.mu.Unlock()
		}()
		f()
	}()
	return true
}

// proposeUpToDate has raft record peer UpToDate at epoch, in the
// background, one proposal per peer at a time. What this node knows raft
// has Outdated is forgotten BEFORE raft may say otherwise, and again once
// it did: a write the peer misses from then on records it Outdated again,
// and that record waits for this one (ensureOutdated), so that raft never
// ends with the peer UpToDate after a write it missed.
func (v *Volume) proposeUpToDate(peer string, epoch uint64) {
	v.mu.Lock()
	a := &v.authority
	if _, busy := a.upToDate[peer]; busy {
		v.mu.Unlock()
		return
	}
	if a.upToDate == nil {
		a.upToDate = map[string]chan struct{}{}
	}
	done := make(chan struct{})
	a.upToDate[peer] = done
	a.forgetLocked(peer)
	v.mu.Unlock()
	started := v.background("propose up-to-date "+peer, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := v.node.cl.c.Propose(ctx, replication.MarkUpToDateCommand(v.name, epoch, peer)); err != nil {
			v.log.Debug("proposal failed", "op", replication.OpMarkUpToDate, "err", err)
		}
		v.mu.Lock()
		a.forgetLocked(peer)
		delete(a.upToDate, peer)
		v.mu.Unlock()
		close(done)
	})
	if !started {
		// Not proposed (the volume stops, or the last proposal's task
		// has closed its wait and not ended yet): nothing may wait for
		// it, or the next write the peer misses (ensureOutdated) would
		// wait forever; the authority's next look proposes it again.
		v.mu.Lock()
		if a.upToDate[peer] == done {
			delete(a.upToDate, peer)
		}
		v.mu.Unlock()
		close(done)
	}
}

// proposeOnce proposes cmd in the background, one of each kind at a time.
func (v *Volume) proposeOnce(kind string, cmd replication.AuthorityCommand) {
	v.background("propose "+kind, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := v.node.cl.c.Propose(ctx, cmd); err != nil {
			v.log.Debug("proposal failed", "op", cmd.Op, "err", err)
		}
	})
}

// confirmed: the state machine names this node primary at its epoch: the
// renewals of its lease run, and a node that restarted as primary serves
// (once its lease is granted). A cluster step that finds both so costs no
// state machine step.
func (v *Volume) confirmed(epoch uint64) {
	v.mu.Lock()
	waiting := v.st.Serving == volstate.Waiting
	settled := !waiting && v.authority.renewingLocked(epoch)
	v.mu.Unlock()
	if settled {
		return
	}
	err := v.drive(volstate.AuthorityChanged{Known: true, Primary: v.self, Epoch: epoch, Now: v.clock.Now()}, driveOptions{})
	if err != nil {
		v.log.Error("follow the cluster", "err", err)
		return
	}
	v.mu.Lock()
	serving := v.st.Serving.IsOpen()
	v.mu.Unlock()
	if waiting && serving {
		v.log.Info("the cluster confirms this node as primary: serving IO")
	}
}

// takeOverAt makes this node primary at epoch, as the cluster decided (a
// failover, or a switchover). Its disk must hold the volume's data: the
// same transition as a handover's promotion (volstate.AuthorityChanged).
func (v *Volume) takeOverAt(epoch uint64, failover bool) {
	v.handedOver.Store(!failover)
	err := v.drive(volstate.AuthorityChanged{Known: true, Primary: v.self, Epoch: epoch, Now: v.clock.Now(), Failover: failover}, driveOptions{notify: func(a volstate.Action) {
		switch a.Detail {
		case "promoted":
			v.log.Warn("promoted by the cluster", "epoch", a.Epoch)
			v.node.event(v.name, "promoted", fmt.Sprintf("%s is primary of %s at epoch %d (decided by raft)", v.self, v.name, a.Epoch))
		case "promotion-refused":
			v.log.Error("the cluster named this node primary, but its disk holds no consistent data; not serving", "epoch", a.Epoch)
			v.node.event(v.name, "promotion-refused", fmt.Sprintf("the cluster named %s primary at epoch %d, but its disk is not UpToDate", v.self, a.Epoch))
		}
	}})
	switch {
	case errors.Is(err, volstate.ErrNoRaftLeader):
		// Taken again on raft's word once a leader answers
		// (followAuthority, at each step of the cluster loop): logged
		// once.
		if !v.node.dataRefusals.First(fmt.Sprintf("%s take-over at %d: no raft leader", v.name, epoch)) {
			return
		}
		v.log.Warn("the cluster named this node primary, but no raft leader answers it now: it takes over once one does", "epoch", epoch)
	case err != nil:
		v.log.Error("take over: write the state", "err", err)
	}
}

// yieldTo stops this primary's IO at once because the cluster names
// another primary (at epoch), then makes it Secondary: requests in flight
// are answered, what it wrote stays marked for the new primary to copy
// (or overwrite), and on_demote runs. One transition with stepDown
// (volstate.AuthorityChanged, then Quiesced).
func (v *Volume) yieldTo(primary string, epoch uint64) {
	err := v.drive(volstate.AuthorityChanged{Known: true, Primary: primary, Epoch: epoch, Now: v.clock.Now()}, driveOptions{
		texts: func(volstate.Cause) reason {
			return because(CauseFenced, "the cluster names %s primary at epoch %d", primary, epoch)
		},
		notify: func(a volstate.Action) {
			v.log.Warn("stepped down: the cluster names another primary", "primary", a.Peer, "epoch", a.Epoch)
			v.node.event(v.name, "stepped-down", fmt.Sprintf("%s is Secondary: the cluster names %s primary at epoch %d", v.self, a.Peer, a.Epoch))
		},
		drainFailed: func(err error) bool {
			v.log.Error("step down: flush bitmaps", "err", err)
			return true
		},
	})
	if err != nil {
		v.log.Error("step down: write the state", "err", err)
	}
}

// adoptEpoch records, durably, that primary holds epoch (after a
// failover: failover): streams of older epochs are refused from now on.
func (v *Volume) adoptEpoch(primary string, epoch uint64, failover bool) {
	if err := v.drive(volstate.AuthorityChanged{Known: true, Primary: primary, Epoch: epoch, Now: v.clock.Now(), Failover: failover}, driveOptions{}); err != nil {
		v.log.Error("adopt the cluster's epoch", "err", err)
	}
}

// --- the lease ---

// ensureLeaseLoop runs the lease renewals of this primary's term.
func (v *Volume) ensureLeaseLoop(epoch uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	a := &v.authority
	if a.renewingLocked(epoch) || isClosed(v.stopping) {
		return
	}
	if a.leaseStop != nil {
		a.leaseStop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.leaseStop, a.leaseLoop = cancel, epoch
	v.bg.Add(1)
	go func() {
		defer v.bg.Done()
		v.renewLeases(ctx, epoch)
	}()
}

// stopLease ends the renewals (the step that asked for it ended the
// lease: IO waiting for one fails over to its deadline or its role).
func (v *Volume) stopLease() {
	v.mu.Lock()
	defer v.mu.Unlock()
	a := &v.authority
	if a.leaseStop != nil {
		a.leaseStop()
		a.leaseStop, a.leaseLoop = nil, 0
	}
	a.wakeLeaseWaitersLocked()
}

// renewLeases renews the lease every third of its duration until ctx ends.
func (v *Volume) renewLeases(ctx context.Context, epoch uint64) {
	cl := v.node.cl
	every := cl.lease / 3
	var watch leaseWatch
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, cl.lease/2)
		until, err := cl.c.RenewLease(rctx, v.name, epoch)
		cancel()
		if err == nil {
			// Through the volume's rules (volstate.LeaseRenewed: the lease
			// of the current term runs until then, and a primary forced
			// without raft serves under it from now). A volume that closes
			// takes no renewal.
			_ = v.drive(volstate.LeaseRenewed{Epoch: epoch, Until: until}, driveOptions{})
		} else if ctx.Err() == nil {
			v.log.Debug("lease not renewed", "epoch", epoch, "err", err)
		}
		if ctx.Err() == nil {
			watch.note(v, epoch, err)
		}
		t := cl.clock.NewTimer(every)
		select {
		case <-ctx.Done():
		case <-v.stopping:
			cancel()
		case <-t.C():
		}
		t.Stop()
		if isClosed(v.stopping) {
			return
		}
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// leaseHeldLocked reports whether this primary may complete IO now: it
// holds a valid lease, or it is not in authority mode. Callers hold v.mu.
func (v *Volume) leaseHeldLocked() bool {
	return !v.st.Auth || v.st.Serving == volstate.OpenWithoutLease || v.node.cl.clock.Now().Before(v.st.LeaseUntil)
}

// holdLease returns once this primary holds a valid lease: IO freezes
// while it does not (it is not failed), and fails when the volume stops
// being served here or ctx ends.
func (v *Volume) holdLease(ctx context.Context) error {
	for {
		v.mu.Lock()
		if v.roleLocked() != replication.Primary || (!v.st.Serving.IsOpen() && !v.leaseHeldLocked()) {
			v.mu.Unlock()
			return fmt.Errorf("%s on %s: %w (%w)", v.name, v.self, ErrNotServing, errShutdown)
		}
		if v.leaseHeldLocked() {
			v.mu.Unlock()
			return nil
		}
		wake := v.authority.leaseWaitLocked()
		v.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-v.stopping:
			return fmt.Errorf("%s on %s: %w (%w)", v.name, v.self, ErrNotServing, errShutdown)
		}
	}
}

// ensureOutdated makes raft record peer Outdated BEFORE this primary
// completes a write without it (or starts a resync that makes it
// Inconsistent): an Outdated node is never promoted by itself. It waits
// (the write freezes) while raft has no quorum, and fails when this node
// is no longer the primary or stops serving.
func (v *Volume) ensureOutdated(peer string) error { return v.recordOutdated(peer, false) }

// recordOutdated is ensureOutdated; with ask it asks raft even when this
// node remembers a record at its epoch. A handshake that resyncs the
// peer asks: the memory may be stale (another primary of a newer epoch
// had raft record the peer UpToDate since), and raft refuses a primary it
// no longer knows at its epoch, so that a fenced primary resyncs nobody
// (a peer told to discard its data would take the old primary's copy
// while raft counts it UpToDate: the sim's seed 12906).
func (v *Volume) recordOutdated(peer string, ask bool) error {
	cl := v.node.cl
	if cl == nil {
		return nil
	}
	v.mu.Lock()
	auth, epoch := v.st.Auth, v.st.Durable.Epoch
	known := v.authority.outdated[peer] == epoch && !ask
	upToDate := v.authority.upToDate[peer]
	v.mu.Unlock()
	if !auth || known {
		return nil
	}
	if upToDate != nil {
		// Raft is being told the peer is UpToDate: this record lands
		// after that one, or raft would end with it UpToDate.
		<-upToDate
	}
	for {
		v.mu.Lock()
		forgets := v.authority.forgets
		v.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), cl.lease)
		_, err := cl.c.Propose(ctx, replication.MarkOutdatedCommand(v.name, epoch, peer))
		cancel()
		switch {
		case err == nil:
			v.mu.Lock()
			a := &v.authority
			if a.outdated == nil {
				a.outdated = map[string]uint64{}
			}
			if a.forgets == forgets {
				// Not if an UpToDate was proposed meanwhile: it may
				// land after this record.
				a.outdated[peer] = epoch
			}
			v.mu.Unlock()
			return nil
		case errors.Is(err, replication.ErrStaleEpoch), errors.Is(err, replication.ErrNotPrimary):
			if !v.awaitReclaim(epoch) {
				return fmt.Errorf("%w: %s is no longer primary of %s at epoch %d: %v", ErrStaleEpoch, v.self, v.name, epoch, err)
			}
			// Forced to primary while raft had no quorum, and raft
			// answers before it recorded this node: the reclaim does
			// (every other node Outdated with it), then this is asked
			// again.
			continue
		}
		v.log.Warn("cannot record an Outdated peer in raft yet; the write waits", "peer", peer, "err", err)
		v.mu.Lock()
		serving := v.st.Serving.IsOpen() && v.roleLocked() == replication.Primary
		v.mu.Unlock()
		if !serving || isClosed(v.stopping) {
			return fmt.Errorf("%s on %s: %w (%w)", v.name, v.self, ErrNotServing, errShutdown)
		}
	}
}

// awaitReclaim waits a while for raft to record this node, forced to
// primary at epoch while raft had no quorum (followAuthority proposes
// it): until its lease is renewed (raft has it primary at that epoch), it
// steps down, or a third of a lease passed. It reports false, at once,
// when this node is not such a primary, or not any more.
func (v *Volume) awaitReclaim(epoch uint64) bool {
	v.mu.Lock()
	forced := v.st.Serving == volstate.OpenWithoutLease && v.roleLocked() == replication.Primary && v.st.Durable.Epoch == epoch
	wake := v.authority.leaseWaitLocked()
	v.mu.Unlock()
	if !forced {
		return false
	}
	timer := v.node.cl.clock.NewTimer(v.node.cl.lease / 3)
	defer timer.Stop()
	select {
	case <-wake:
	case <-timer.C():
	case <-v.stopping:
		return false
	}
	return true
}

// outdateBeforeResync makes raft record peer Outdated when the connection
// about to be decided will resync it (its disk is Inconsistent meanwhile).
// It runs before the decision takes v.stateMu: it may wait for raft.
func (p *peer) outdateBeforeResync(reply replication.HelloReply, outdated bool) error {
	v := p.v
	v.mu.Lock()
	auth, local := v.st.Auth, v.uuidsLocked(p.name)
	v.mu.Unlock()
	if !auth {
		return nil
	}
	d := replication.CompareUUIDs(local, reply.UUIDs, replication.Primary, replication.Secondary)
	if outdated {
		d = d.TowardOutdated()
	}
	discard := !reply.DiscardFrom.IsZero()
	if d.Outcome.IsTarget() && !discard {
		// A pull: the peer is the source, whose copy is kept; nothing of
		// it is resynced. (Recorded Outdated, it would be no source for
		// this primary's next handshake, after a crash mid-pull.)
		return nil
	}
	if d.Outcome.IsSource() || p.bm.Count() > 0 || len(reply.Changed) > 0 || discard {
		return v.recordOutdated(p.name, true)
	}
	return nil
}

// failoverReasons says, on the leader, why volumes are not failed over.
func (n *Node) failoverReasons() string {
	if n.cl == nil {
		return ""
	}
	n.cl.mu.Lock()
	var whys []string
	for vol, why := range n.cl.failoverWhy {
		if why != "" {
			whys = append(whys, vol+": "+why)
		}
	}
	n.cl.mu.Unlock()
	sort.Strings(whys)
	out := ""
	for _, w := range whys {
		out = human.Join(out, w)
	}
	return out
}
