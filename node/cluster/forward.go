package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/replication"
)

// ForwardKind names what a ForwardRequest asks of the leader.
type ForwardKind string

// Requests to the leader.
const (
	KindPropose    ForwardKind = "propose"
	KindRenewLease ForwardKind = "renew-lease"
	// KindRenewLeases renews several volumes' leases of one node at once
	// (renewals.go); KindRenewLease, one, is still answered.
	KindRenewLeases  ForwardKind = "renew-leases"
	KindReleaseLease ForwardKind = "release-lease"
	KindAddVoter     ForwardKind = "add-voter"
	KindRemoveVoter  ForwardKind = "remove-voter"
	// KindVoters asks any node (not only the leader) for the voters of
	// its configuration; KindRemoved tells a node the leader removed that
	// it is no longer one (membership.go).
	KindVoters  ForwardKind = "voters"
	KindRemoved ForwardKind = "removed"
)

// ForwardRequest is a request a node sends the leader; it encodes to JSON.
type ForwardRequest struct {
	Kind ForwardKind `json:"kind"`
	// From is the sending node (the lease holder for a lease request).
	From    string                        `json:"from"`
	Command *replication.AuthorityCommand `json:"command,omitempty"` // propose
	Volume  string                        `json:"volume,omitempty"`  // leases
	Epoch   uint64                        `json:"epoch,omitempty"`   // leases
	Member  *Member                       `json:"member,omitempty"`  // add-voter, remove-voter (Name only)
	Voters  []string                      `json:"voters,omitempty"`  // removed
	Leases  []LeaseClaim                  `json:"leases,omitempty"`  // renew-leases
}

// ForwardReply is the leader's answer. Code is empty on success; otherwise
// it names the error's class and Message is its text, which the proposer
// turns back into an error that errors.Is matches against the same
// sentinel (replication.ErrStaleEpoch, ErrNoQuorum, ...).
type ForwardReply struct {
	// Volume is the volume's state after a proposal, or its current
	// state when the proposal was refused.
	Volume  replication.VolumeAuthority `json:"volume"`
	Code    string                      `json:"code,omitempty"`
	Message string                      `json:"message,omitempty"`
	// Voters and Quorum answer KindVoters: the voters of the node's
	// configuration, and whether it hears from a leader with a majority.
	Voters []string `json:"voters,omitempty"`
	Quorum bool     `json:"quorum,omitempty"`
	// Leases answers KindRenewLeases, a grant per claim in its order.
	Leases []LeaseGrant `json:"leases,omitempty"`
}

// Errors of this package, checked with errors.Is.
var (
	// ErrNoQuorum: no leader with a majority answered in time; nothing
	// was decided.
	ErrNoQuorum = errors.New("no raft leader with a quorum")
	// ErrOutcomeUnknown: the command reached raft but the leader lost its
	// office (or the wait ended) before it was known applied; read
	// Authority to learn whether it took effect.
	ErrOutcomeUnknown = errors.New("outcome unknown")
	// ErrPromotionPending: no lease is granted while a promotion of
	// another node waits for the volume's lease to run out.
	ErrPromotionPending = errors.New("a promotion is waiting for the lease to run out")
	// ErrClosed: the Cluster (or its raft) is shut down.
	ErrClosed = errors.New("cluster closed")
	// ErrBadRequest: a forwarded request without what its kind needs.
	ErrBadRequest = errors.New("malformed forward request")
	// ErrLeadershipChanged: ProposeAsLeader found this node no longer
	// leading in the office it was given; nothing was decided.
	ErrLeadershipChanged = errors.New("raft leadership changed since the decision")
	// errNotLeader: the node asked is not the leader; the sender retries
	// with the leader it learns of next.
	errNotLeader = errors.New("not the raft leader")
	// ErrSenderNotAVoter: a forwarded request from a node that is not a
	// voter of this node's raft configuration (or names no sender);
	// nothing was done.
	ErrSenderNotAVoter = errors.New("the sender is not a raft voter")
)

// errorCodes name the error classes that cross a forward.
var errorCodes = []struct {
	code string
	err  error
}{
	{"stale-epoch", replication.ErrStaleEpoch},
	{"not-up-to-date", replication.ErrNotUpToDate},
	{"unknown-volume", replication.ErrUnknownVolume},
	{"not-primary", replication.ErrNotPrimary},
	{"not-a-data-node", replication.ErrNotADataNode},
	{"removes-primary", replication.ErrRemovesPrimary},
	{"bad-command", replication.ErrBadCommand},
	{"volume-exists", replication.ErrVolumeExists},
	{"no-quorum", ErrNoQuorum},
	{"outcome-unknown", ErrOutcomeUnknown},
	{"promotion-pending", ErrPromotionPending},
	{"closed", ErrClosed},
	{"bad-request", ErrBadRequest},
	{"not-leader", errNotLeader},
	{"not-a-voter", ErrNotAVoter},
	{"sender-not-a-voter", ErrSenderNotAVoter},
}

// replyOf encodes the leader's result.
func replyOf(va replication.VolumeAuthority, err error) ForwardReply {
	r := ForwardReply{Volume: va}
	if err == nil {
		return r
	}
	r.Code, r.Message = "error", err.Error()
	for _, e := range errorCodes {
		if errors.Is(err, e.err) {
			r.Code = e.code
			break
		}
	}
	return r
}

// Err decodes the reply's error: nil, or an error that errors.Is matches
// against the sentinel its code names.
func (r ForwardReply) Err() error {
	if r.Code == "" {
		return nil
	}
	for _, e := range errorCodes {
		if e.code == r.Code {
			return &remoteError{msg: r.Message, class: e.err}
		}
	}
	return errors.New(r.Message)
}

// remoteError is an error with its own text and a class for errors.Is:
// one the leader returned, or a refusal in words (NotAVoter).
type remoteError struct {
	msg   string
	class error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.class }

// Propose submits cmd to raft: Apply on the leader, through the Forwarder
// from any other node. It returns once the leader applied it, with the
// volume's new state, or with the typed error of
// replication.Authority.Apply and the volume's current state. A promotion
// that changes the primary first waits, on the leader, until LeaseFree
// (refusing the old primary's renewals meanwhile): up to
// LeaseDuration×(1+LeaseDrift) after the old primary's last renewal, or
// after the leader took office; give ctx that much. A promotion already
// in place (the node is primary at Epoch+1) succeeds. When the Forwarder
// fails, Propose waits for another leader and tries it, until ctx ends.
// Other errors: ErrNoQuorum, ErrOutcomeUnknown, ErrClosed, the
// Forwarder's.
func (c *Cluster) Propose(ctx context.Context, cmd replication.AuthorityCommand) (replication.VolumeAuthority, error) {
	reply, err := c.toLeader(ctx, ForwardRequest{Kind: KindPropose, From: c.self, Command: &cmd})
	va := reply.Volume
	if cmd.Op == replication.OpPromote && errors.Is(err, replication.ErrStaleEpoch) &&
		va.Primary == cmd.Node && va.Epoch == cmd.Epoch+1 {
		return va, nil // in place already: a retry after a lost reply, or the same decision twice
	}
	return va, err
}

// AddVoter adds m to raft as a voter (runtime membership); m's node runs
// with NoBootstrap. It also gossips with m from now on. It returns the
// voters once the leader committed the change, as the leader has them
// (this node may learn of it a heartbeat later).
func (c *Cluster) AddVoter(ctx context.Context, m Member) ([]string, error) {
	if err := m.validate(); err != nil {
		return nil, err
	}
	c.addMember(m)
	reply, err := c.toLeader(ctx, ForwardRequest{Kind: KindAddVoter, From: c.self, Member: &m})
	return reply.Voters, err
}

// RemoveVoter removes the node from raft. A removed follower is not told:
// it hears from no leader any more and starts no election; close it. A
// removed leader steps down and shuts its raft down. It returns the voters
// once the leader committed the change, as AddVoter does.
func (c *Cluster) RemoveVoter(ctx context.Context, name string) ([]string, error) {
	reply, err := c.toLeader(ctx, ForwardRequest{Kind: KindRemoveVoter, From: c.self, Member: &Member{Name: name}})
	if err == nil {
		c.gossip.remove(name)
	}
	return reply.Voters, err
}

// toLeader runs req on the leader: here if this node leads, else through
// the Forwarder. It follows the leader as it changes, until ctx ends.
func (c *Cluster) toLeader(ctx context.Context, req ForwardRequest) (ForwardReply, error) {
	for {
		leader, err := c.waitLeader(ctx)
		if err != nil {
			return ForwardReply{}, err
		}
		var reply ForwardReply
		if leader == c.self {
			reply = c.HandleForward(ctx, req)
		} else if reply, err = c.forwardTo(ctx, leader, req); err != nil {
			// The leader may be gone: try the next one, or this one again
			// after a heartbeat timeout. Every request may run twice
			// (commands compare-and-set the epoch or repeat harmlessly; a
			// renewal's lease counts from the first send).
			err = fmt.Errorf("forward %s to the leader %s: %w", req.Kind, leader, err)
			wctx, cancel := context.WithTimeout(ctx, c.cfg.Timing.HeartbeatTimeout)
			werr := c.waitLeaderOtherThan(wctx, leader)
			cancel()
			if werr != nil && ctx.Err() != nil {
				return ForwardReply{}, fmt.Errorf("%w; %w", err, werr)
			}
			continue
		}
		err = reply.Err()
		if errors.Is(err, ErrOutcomeUnknown) && (req.Kind == KindPropose || req.Kind == KindAddVoter || req.Kind == KindRemoveVoter) {
			// The leader lost its office while committing: run the
			// command again (every command may run twice, see above; a
			// membership change twice is the same configuration, which
			// raft commits again unchanged). The pause is raft's time,
			// as transferRetry's: what it waits for is raft's election,
			// which keeps real time. On the cluster's clock a test's fake
			// that nobody advances held the retry until ctx ended, and
			// the command failed with "outcome unknown".
			pause := c.raftTime.NewTimer(50 * time.Millisecond)
			select {
			case <-ctx.Done():
				pause.Stop()
				return reply, err
			case <-pause.C():
			}
			continue
		}
		if !errors.Is(err, errNotLeader) {
			return reply, err
		}
		if err := c.waitLeaderOtherThan(ctx, leader); err != nil {
			return ForwardReply{}, err
		}
	}
}

// forwardTo sends req to leader, and gives up on it as soon as this node
// sees another leader (or none): a leader that died or was cut off would
// otherwise hold the request until ctx ends, although a new leader is
// elected within an election timeout.
func (c *Cluster) forwardTo(ctx context.Context, leader string, req ForwardRequest) (ForwardReply, error) {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		if c.waitLeaderOtherThan(fctx, leader) == nil {
			cancel(errLeaderMoved)
		}
	}()
	reply, err := c.cfg.Forward(fctx, leader, req)
	if err == nil && reply.Err() != nil && errors.Is(context.Cause(fctx), errLeaderMoved) {
		// The leader may have answered only because the call was given
		// up (a command waiting out a leadership transfer ends so): the
		// sender asks the next leader.
		err = fmt.Errorf("%w: %w", errLeaderMoved, reply.Err())
	}
	return reply, err
}

// errLeaderMoved: a forwarded request was given up because the sender
// saw another leader (or none).
var errLeaderMoved = errors.New("the sender saw the leadership move")

// HandleForward runs a forwarded request on this node, the leader. Its
// errors travel in the reply; a node that is not (any more) the leader
// answers so, and the sender tries the next leader. Only a voter of this
// node's raft configuration may ask anything but the voters (a removed or
// joining node asks them): req.From names the sender, which the node
// layer binds to the certificate of the call (a node speaks for itself
// only), and a node of the CA that is no voter (removed, or never added)
// neither proposes, nor renews or releases a lease, nor changes the
// membership, nor tells this node it was removed.
func (c *Cluster) HandleForward(ctx context.Context, req ForwardRequest) ForwardReply {
	if c.ctx.Err() != nil {
		return replyOf(replication.VolumeAuthority{}, ErrClosed)
	}
	if req.Kind == KindVoters {
		return c.votersReply()
	}
	if err := c.checkSender(req); err != nil {
		return replyOf(replication.VolumeAuthority{}, err)
	}
	switch req.Kind {
	case KindRemoved:
		c.learnVoters(req.Voters)
		return ForwardReply{}
	}
	if err := c.NotAVoter(); err != nil {
		return replyOf(replication.VolumeAuthority{}, err)
	}
	var va replication.VolumeAuthority
	var err error
	switch {
	case req.Kind == KindPropose && req.Command != nil:
		va, err = c.proposeHere(ctx, *req.Command)
	case req.Kind == KindRenewLease:
		err = c.grantLease(ctx, req.From, req.Volume, req.Epoch)
	case req.Kind == KindRenewLeases:
		grants, err := c.grantLeases(ctx, req.From, req.Leases)
		r := replyOf(va, err)
		r.Leases = grants
		return r
	case req.Kind == KindReleaseLease:
		err = c.releaseLease(req.From, req.Volume, req.Epoch)
	case req.Kind == KindAddVoter && req.Member != nil:
		if err = c.addVoterHere(ctx, *req.Member); err == nil {
			return c.committedVoters()
		}
	case req.Kind == KindRemoveVoter && req.Member != nil && req.Member.Name != "":
		if err = c.changeConfiguration(ctx, c.raft.RemoveServer(raft.ServerID(req.Member.Name), 0, 0)); err == nil {
			c.tellRemoved(ctx, req.Member.Name)
			return c.committedVoters()
		}
	default:
		err = fmt.Errorf("%w: %s from %s", ErrBadRequest, req.Kind, req.From)
	}
	return replyOf(va, err)
}

// committedVoters answers a membership change the leader committed: the
// voters of its configuration now.
func (c *Cluster) committedVoters() ForwardReply {
	voters, _ := c.configVoters()
	return ForwardReply{Voters: voters}
}

// ProposeAsLeader applies cmd on this node only, and only while it leads
// in the office it took at office (LeaseWatch's leadingSince when the
// caller decided): a leader's failover is its own judgement, to be
// carried out neither by another leader nor by itself in a later office,
// after a time it did not observe. It is never forwarded. Errors: those
// of Propose, and ErrLeadershipChanged.
func (c *Cluster) ProposeAsLeader(ctx context.Context, cmd replication.AuthorityCommand, office time.Time) (replication.VolumeAuthority, error) {
	if c.ctx.Err() != nil {
		return replication.VolumeAuthority{}, ErrClosed
	}
	if office.IsZero() {
		return replication.VolumeAuthority{}, fmt.Errorf("%w: no office given", ErrLeadershipChanged)
	}
	va, err := c.proposeIn(ctx, cmd, office)
	if errors.Is(err, errNotLeader) {
		err = fmt.Errorf("%w: %w", ErrLeadershipChanged, err)
	}
	return va, err
}

// proposeHere applies cmd on this node, the leader.
func (c *Cluster) proposeHere(ctx context.Context, cmd replication.AuthorityCommand) (replication.VolumeAuthority, error) {
	return c.proposeIn(ctx, cmd, time.Time{})
}

// proposeIn applies cmd on this node, the leader, in the office it took
// at office (zero: whichever it holds).
func (c *Cluster) proposeIn(ctx context.Context, cmd replication.AuthorityCommand, office time.Time) (replication.VolumeAuthority, error) {
	inOffice := func() bool {
		return c.raft.State() == raft.Leader && (office.IsZero() || c.leases.office().Equal(office))
	}
	if !inOffice() {
		return replication.VolumeAuthority{}, errNotLeader
	}
	if cmd.Op != replication.OpPromote {
		return c.applyInOffice(ctx, cmd, inOffice)
	}
	// A promotion: with the state machine current (barrier), a command
	// its rules refuse is refused now, without waiting for a lease.
	if err := c.barrier(ctx); err != nil {
		return replication.VolumeAuthority{}, err
	}
	current := c.fsm.authority()
	if _, va, err := current.Apply(cmd); err != nil {
		return va, err
	}
	if va, _ := current.Volume(cmd.Volume); va.Primary != cmd.Node {
		unfence := c.leases.fence(cmd.Volume)
		defer unfence()
		if err := c.waitLeaseFree(ctx, cmd.Volume, office); err != nil {
			return va, err
		}
	}
	if !inOffice() {
		return replication.VolumeAuthority{}, errNotLeader
	}
	return c.applyInOffice(ctx, cmd, inOffice)
}

// applyInOffice applies cmd while inOffice holds. A leader handing its
// office over (a leadership transfer) refuses commands meanwhile, before
// they reach its log, so the command is asked again every transferRetry
// until the transfer ends: applied when this node leads on in the office,
// errNotLeader when it does not, or ctx's end.
func (c *Cluster) applyInOffice(ctx context.Context, cmd replication.AuthorityCommand, inOffice func() bool) (replication.VolumeAuthority, error) {
	var va replication.VolumeAuthority
	err := c.untilTransferEnds(ctx, func() error {
		if !inOffice() {
			return errNotLeader
		}
		var err error
		va, err = c.apply(ctx, cmd)
		return err
	})
	return va, err
}

// apply commits cmd through raft on this node, the leader, and returns
// what the state machine answered.
func (c *Cluster) apply(ctx context.Context, cmd replication.AuthorityCommand) (replication.VolumeAuthority, error) {
	data, err := json.Marshal(cmd)
	if err != nil {
		return replication.VolumeAuthority{}, fmt.Errorf("%w: %v", replication.ErrBadCommand, err)
	}
	f := c.raft.Apply(data, c.enqueueTimeout(ctx))
	if err := c.waitFuture(ctx, f); err != nil {
		return replication.VolumeAuthority{}, fmt.Errorf("%s %s: %w", cmd.Op, cmd.Volume, err)
	}
	res := f.Response().(applyResult)
	return res.volume, res.err
}

// Barrier returns once this node, the leader, has applied every entry
// committed before the call (its state machine is current), in the
// office it held when called (LeadingSince). Errors: ErrLeadershipChanged
// (it does not lead, or no longer), ErrNoQuorum, ErrOutcomeUnknown,
// ErrClosed.
func (c *Cluster) Barrier(ctx context.Context) (office time.Time, err error) {
	office = c.LeadingSince()
	if office.IsZero() {
		return office, fmt.Errorf("%w: %s does not lead", ErrLeadershipChanged, c.self)
	}
	// A leader that hands its office over (a leadership transfer)
	// refuses barriers meanwhile: the barrier waits the transfer out,
	// and is taken when this node leads on or refused (errNotLeader)
	// when another does. (The leases' and promotions' barriers fail at
	// once instead: their callers retry on their own schedule.)
	err = c.untilTransferEnds(ctx, func() error { return c.barrier(ctx) })
	if err != nil {
		if errors.Is(err, errNotLeader) {
			err = fmt.Errorf("%w: %w", ErrLeadershipChanged, err)
		}
		return office, err
	}
	return office, nil
}

// transferRetry is how often a barrier or a command refused for a
// leadership transfer under way is asked again.
const transferRetry = 50 * time.Millisecond

// untilTransferEnds runs try, and again every transferRetry while it is
// refused for a leadership transfer under way (raft refuses barriers and
// commands then before they reach its log: asking again is safe), until
// it answers otherwise or ctx ends.
func (c *Cluster) untilTransferEnds(ctx context.Context, try func() error) error {
	err := try()
	for errors.Is(err, raft.ErrLeadershipTransferInProgress) {
		t := c.raftTime.NewTimer(transferRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (%w)", err, context.Cause(ctx))
		case <-t.C():
		}
		err = try()
	}
	return err
}

// barrier commits an empty entry in this leader's term and waits until
// the state machine applied everything before it: a majority accepted
// this node as leader after the call began, and the state machine is
// current.
func (c *Cluster) barrier(ctx context.Context) error {
	err := c.waitFuture(ctx, c.raft.Barrier(c.enqueueTimeout(ctx)))
	switch {
	case errors.Is(err, raft.ErrLeadershipLost):
		return errNotLeader // a barrier changes nothing: the next leader may take the request
	case err != nil:
		return fmt.Errorf("raft barrier: %w", err)
	}
	return nil
}

func (c *Cluster) addVoterHere(ctx context.Context, m Member) error {
	if err := m.validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	c.addMember(m)
	return c.changeConfiguration(ctx, c.raft.AddVoter(raft.ServerID(m.Name), raft.ServerAddress(m.Raft), 0, 0))
}

func (c *Cluster) changeConfiguration(ctx context.Context, f raft.IndexFuture) error {
	if err := c.waitFuture(ctx, f); err != nil {
		return fmt.Errorf("raft configuration change: %w", err)
	}
	return nil
}

// enqueueTimeout bounds raft's wait to take an entry: ctx's deadline, or
// none. Both the deadline (the context package's) and raft's timeout are
// real time.
func (c *Cluster) enqueueTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(c.raftTime.Until(d), time.Millisecond)
	}
	return 0
}

// waitFuture waits for a raft future until ctx ends or the cluster
// closes, and classes raft's errors. The close bounds the wait because
// raft may never answer a future it took before its shutdown (an entry
// on its way to the state machine; hashicorp/raft issue 498), even when
// ctx has no deadline.
func (c *Cluster) waitFuture(ctx context.Context, f raft.Future) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(c.ctx, func() { cancel(ErrClosed) })()
	return waitFuture(ctx, f)
}

// waitFuture waits for a raft future until ctx ends, and classes raft's
// errors. The future's outcome is unknown when ctx ends first; the error
// wraps ctx's cause too.
func waitFuture(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, context.Cause(ctx))
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader):
		return errNotLeader
	case errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrAbortedByRestore):
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	case errors.Is(err, raft.ErrRaftShutdown):
		return fmt.Errorf("%w: %w", ErrClosed, err)
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return fmt.Errorf("%w: %w", ErrNoQuorum, err)
	}
	return err
}

// checkSender refuses a forwarded request whose sender is not a voter of
// this node's latest raft configuration, and logs the refusal once per
// sender and cause.
func (c *Cluster) checkSender(req ForwardRequest) error {
	voters, _ := c.configVoters()
	if req.From != "" && slices.Contains(voters, req.From) {
		return nil
	}
	words := fmt.Sprintf("cluster: refused a forwarded %s request from %q: it is not a voter of this node's raft configuration (voters: %s)", req.Kind, req.From, strings.Join(voters, ", "))
	if req.From == "" {
		words = fmt.Sprintf("cluster: refused a forwarded %s request that names no sender", req.Kind)
	}
	if c.forwardRefusals.First(req.From + " " + string(req.Kind)) {
		c.logger.Warn(words)
		if c.cfg.Refused != nil {
			c.cfg.Refused(words)
		}
	} else {
		c.logger.Debug(words)
	}
	return fmt.Errorf("%w: %s", ErrSenderNotAVoter, words)
}
