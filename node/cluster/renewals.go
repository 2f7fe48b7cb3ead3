package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/replication"
)

// Lease renewals travel per node, not per volume: a node primary of many
// volumes renews them all in one request, and the leader grants all the
// requests that arrive while a barrier runs with the next barrier. What a
// lease means does not change (lease.go): each volume's lease still counts
// from the moment its renewal was SENT, is granted only after a barrier
// appended after that send is committed, and is checked against the state
// machine per volume. Only the cost changes: one forward and one raft
// entry per node and round, where it was one per volume.

// LeaseClaim is one volume's renewal in a batch: this node claims to be
// volume's primary at epoch.
type LeaseClaim struct {
	Volume string `json:"volume"`
	Epoch  uint64 `json:"epoch"`
}

// LeaseGrant is the leader's answer to one LeaseClaim: empty Code when
// granted, else the error's class and words (as ForwardReply's).
type LeaseGrant struct {
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// err is the grant's error, nil when granted.
func (g LeaseGrant) err() error {
	return ForwardReply{Code: g.Code, Message: g.Message}.Err()
}

// renewal is one RenewLease call waiting for its batch.
type renewal struct {
	claim LeaseClaim
	done  chan renewed // buffered: the batch never waits for the caller
}

type renewed struct {
	sent time.Time
	err  error
}

// renewer gathers the RenewLease calls of this node: while one batch is
// with the leader, the calls that arrive wait and go together in the next
// (group commit: no call waits for a timer, and the batches grow with
// the load).
type renewer struct {
	mu      lockorder.Mutex
	queue   []*renewal
	sending bool
}

// renew sends claim in the next batch and returns when the batch is
// answered (sent is when it was sent), or ctx ends.
func (c *Cluster) renew(ctx context.Context, claim LeaseClaim) (sent time.Time, err error) {
	if c.ctx.Err() != nil {
		return time.Time{}, ErrClosed
	}
	r := &renewal{claim: claim, done: make(chan renewed, 1)}
	c.renewer.mu.Lock()
	c.renewer.queue = append(c.renewer.queue, r)
	start := !c.renewer.sending
	c.renewer.sending = true
	c.renewer.mu.Unlock()
	if start {
		c.wg.Add(1)
		go c.sendRenewals()
	}
	select {
	case res := <-r.done:
		return res.sent, res.err
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

// sendRenewals sends the queued renewals, a batch at a time, until none
// is left.
func (c *Cluster) sendRenewals() {
	defer c.wg.Done()
	for {
		c.renewer.mu.Lock()
		batch := c.renewer.queue
		c.renewer.queue = nil
		if len(batch) == 0 {
			c.renewer.sending = false
			c.renewer.mu.Unlock()
			return
		}
		c.renewer.mu.Unlock()
		c.sendBatch(batch)
	}
}

// renewTimeout bounds one batch: a renewal is worth nothing after its
// lease would have run out anyway.
func (c *Cluster) renewTimeout() time.Duration { return c.leases.duration }

// sendBatch asks the leader to grant batch and answers each renewal. A
// volume claimed twice in one batch is claimed once (a caller that gave
// up left its claim behind; the newer one counts).
func (c *Cluster) sendBatch(batch []*renewal) {
	ctx, cancel := context.WithTimeout(c.ctx, c.renewTimeout())
	defer cancel()
	claims := make([]LeaseClaim, 0, len(batch))
	index := map[LeaseClaim]int{}
	for _, r := range batch {
		if _, ok := index[r.claim]; !ok {
			index[r.claim] = len(claims)
			claims = append(claims, r.claim)
		}
	}
	sent := c.cfg.Clock.Now()
	reply, err := c.toLeader(ctx, ForwardRequest{Kind: KindRenewLeases, From: c.self, Leases: claims})
	for _, r := range batch {
		res := renewed{sent: sent, err: err}
		if err == nil {
			i := index[r.claim]
			if i < len(reply.Leases) {
				res.err = reply.Leases[i].err()
			} else {
				res.err = fmt.Errorf("%w: the leader answered %d of %d lease claims", ErrBadRequest, len(reply.Leases), len(claims))
			}
		}
		r.done <- res
	}
}

// sharedBarrier is the leader's group commit of barriers: a caller waits
// for a barrier that STARTED after it called (one already running may
// have been appended before the caller's request arrived), and the
// callers that arrive while one runs share the next.
type sharedBarrier struct {
	mu      lockorder.Mutex
	running bool
	// next is the barrier the callers arriving now wait for; it starts
	// when the running one ends.
	next *barrierRound
}

type barrierRound struct {
	done chan struct{}
	err  error
}

// grantBarrier returns once a raft barrier appended after this call was
// committed, or with its error.
func (c *Cluster) grantBarrier(ctx context.Context) error {
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	b := &c.barriers
	b.mu.Lock()
	if b.next == nil {
		b.next = &barrierRound{done: make(chan struct{})}
	}
	round := b.next
	if !b.running {
		b.running = true
		c.wg.Add(1)
		go c.runBarriers()
	}
	b.mu.Unlock()
	select {
	case <-round.done:
		return round.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runBarriers runs the waiting rounds one after the other until none
// waits.
func (c *Cluster) runBarriers() {
	defer c.wg.Done()
	b := &c.barriers
	for {
		b.mu.Lock()
		round := b.next
		b.next = nil
		if round == nil {
			b.running = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		ctx, cancel := context.WithTimeout(c.ctx, c.renewTimeout())
		round.err = c.barrier(ctx)
		cancel()
		close(round.done)
	}
}

// grantLeases is the leader's side of a batch: each claim is granted as
// grantLease grants one, all after one shared barrier.
func (c *Cluster) grantLeases(ctx context.Context, from string, claims []LeaseClaim) ([]LeaseGrant, error) {
	if len(claims) == 0 {
		return nil, fmt.Errorf("%w: a lease batch without claims from %s", ErrBadRequest, from)
	}
	if c.raft.State() != raft.Leader {
		return nil, errNotLeader
	}
	grants := make([]LeaseGrant, len(claims))
	began := make([]bool, len(claims))
	granted := make([]bool, len(claims))
	defer func() {
		now := c.cfg.Clock.Now()
		for i, cl := range claims {
			if began[i] {
				c.leases.end(cl.Volume, granted[i], now)
			}
		}
	}()
	for i, cl := range claims {
		if err := c.leases.begin(cl.Volume); err != nil {
			grants[i] = grantOf(err)
			continue
		}
		began[i] = true
	}
	if err := c.grantBarrier(ctx); err != nil {
		return nil, err
	}
	for i, cl := range claims {
		if !began[i] {
			continue
		}
		err := c.checkHolder(from, cl.Volume, cl.Epoch)
		granted[i] = err == nil
		grants[i] = grantOf(err)
	}
	return grants, nil
}

// grantOf is err as a LeaseGrant (nil: granted).
func grantOf(err error) LeaseGrant {
	r := replyOf(replication.VolumeAuthority{}, err)
	return LeaseGrant{Code: r.Code, Message: r.Message}
}
