package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/internal/lockorder"
)

// A node removed from raft (replctl node remove) hears from no leader any
// more: hashicorp/raft stops replicating to it at once, so it seldom sees
// the configuration without itself, and it starts elections nobody
// grants. It learns of its removal three ways: the leader that removed it
// tells it (best effort), it asks the other members once it has heard
// from no leader for a while, and its own raft may see the configuration
// without it and shut down. From then on its Status says so, naming the
// voters, and every request that needs the leader fails at once with
// ErrNotAVoter instead of waiting for a leader that never comes. A leader
// that reaches it again (replctl node add) ends that. A node started with
// NoBootstrap and not added yet learns the same way that it is not a
// voter yet.

// ErrNotAVoter: this node is not (any more) a raft voter; nothing that
// needs the leader can be done through it.
var ErrNotAVoter = errors.New("not a raft voter")

// membership holds what this node learned of its own standing.
type membership struct {
	mu       lockorder.Mutex
	standing Standing
	voters   []string  // the cluster's voters, as told
	since    time.Time // when it learned its standing
	// cfgIndex is the index of this node's raft configuration when it
	// learned it is not a voter: only a newer configuration with it as a
	// voter (replctl node add) makes it one again.
	cfgIndex uint64
}

// set records standing (with the voters told, and the index of this
// node's configuration then); it reports a change.
func (m *membership) set(s Standing, voters []string, now time.Time, cfgIndex uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	changed := m.standing != s || !slices.Equal(m.voters, voters)
	if changed {
		m.standing, m.voters, m.since, m.cfgIndex = s, slices.Clone(voters), now, cfgIndex
	}
	return changed
}

// cfgIndexThen is the configuration index recorded with the standing.
func (m *membership) cfgIndexThen() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cfgIndex
}

func (m *membership) get() (Standing, []string, time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.standing, slices.Clone(m.voters), m.since
}

// NotAVoter returns an error that errors.Is matches against ErrNotAVoter,
// its text the words an operator needs, while this node knows it is not a
// voter; nil otherwise.
func (c *Cluster) NotAVoter() error {
	standing, voters, _ := c.member.get()
	if standing == "" {
		return nil
	}
	return &remoteError{msg: standingText(c.self, standing, voters), class: ErrNotAVoter}
}

// standingText says what standing means, in the words status and refusals
// use.
func standingText(self string, standing Standing, voters []string) string {
	list := strings.Join(voters, ", ")
	if list == "" {
		list = "not known here"
	}
	if standing == Joining {
		return fmt.Sprintf("this node (%s) is not a voter of the cluster yet; the voters are %s; replctl node add %s (to one of them) makes it one", self, list, self)
	}
	return fmt.Sprintf("this node (%s) was removed from the cluster; it is no longer a voter; the voters are %s; send commands to one of them", self, list)
}

// hasLeader reports whether this node hears from a leader with a
// majority (or is that leader), with a contact after since.
func (c *Cluster) hasLeader(since time.Time) bool {
	_, id := c.raft.LeaderWithID()
	switch {
	case id == "":
		return false
	case c.raft.State() == raft.Leader:
		return string(id) == c.self
	default:
		last := c.raft.LastContact()
		return last.After(since) && c.raftTime.Since(last) < c.cfg.Timing.HeartbeatTimeout
	}
}

// configVoters returns the voters of this node's latest raft
// configuration, sorted, and whether raft answered.
func (c *Cluster) configVoters() ([]string, bool) {
	f := c.raft.GetConfiguration()
	if f.Error() != nil {
		return nil, false
	}
	var voters []string
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			voters = append(voters, string(srv.ID))
		}
	}
	slices.Sort(voters)
	return voters, true
}

// learnVoters takes the cluster's voters as another node (with a leader)
// reports them: without this node, it is not a voter.
func (c *Cluster) learnVoters(voters []string) {
	now := c.raftTime.Now() // compared with raft's LastContact (hasLeader)
	if slices.Contains(voters, c.self) {
		if c.member.set("", nil, now, 0) {
			c.logger.Info("this node is a raft voter again", "voters", voters)
			c.signalChanged()
		}
		return
	}
	standing := Removed
	if own, ok := c.configVoters(); ok && !slices.Contains(own, c.self) && c.cfg.NoBootstrap {
		standing = Joining
	}
	if c.member.set(standing, voters, now, c.configIndex()) {
		c.logger.Warn(standingText(c.self, standing, voters))
		c.leaderChange.fire() // waiters for a leader give up
		c.signalChanged()
	}
}

// watchMembership runs until ctx ends: once this node has heard from no
// leader for a few election timeouts, it asks the other members whom the
// cluster counts as voters; a leader reaching it again with a
// configuration that has it as a voter ends a removal.
func (c *Cluster) watchMembership(ctx context.Context) {
	tick := c.cfg.Clock.NewTicker(c.cfg.Timing.RejoinInterval)
	defer tick.Stop()
	var leaderless time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C():
		}
		standing, _, learned := c.member.get()
		if c.hasLeader(learned) && (standing == "" || c.votesInOwnConfig()) {
			leaderless = time.Time{}
			if c.member.set("", nil, c.raftTime.Now(), 0) {
				c.logger.Info("a raft leader reaches this node: it is a voter again")
				c.signalChanged()
			}
			continue
		}
		now := c.cfg.Clock.Now()
		if leaderless.IsZero() {
			leaderless = now
		}
		if c.raft.State() != raft.Shutdown && now.Sub(leaderless) < 3*c.cfg.Timing.ElectionTimeout {
			continue
		}
		if voters, ok := c.askVoters(ctx); ok {
			c.learnVoters(voters)
		} else if c.raft.State() == raft.Shutdown && ctx.Err() == nil {
			// Raft shut itself down: it saw a configuration without
			// this node (ShutdownOnRemove).
			if standing, voters, _ := c.member.get(); standing == "" {
				c.learnVoters(voters)
			}
		}
	}
}

// votesInOwnConfig reports whether this node's latest raft configuration
// is newer than the one it had when it learned it is not a voter, and has
// it as a voter. A removed node that a leader still reaches (in the
// moments after the removal its own log may never hold) is a voter again
// only once a configuration with it arrives: replctl node add.
func (c *Cluster) votesInOwnConfig() bool {
	f := c.raft.GetConfiguration()
	if f.Error() != nil || f.Index() <= c.member.cfgIndexThen() {
		return false
	}
	for _, srv := range f.Configuration().Servers {
		if string(srv.ID) == c.self && srv.Suffrage == raft.Voter {
			return true
		}
	}
	return false
}

// configIndex is the index of this node's latest raft configuration.
func (c *Cluster) configIndex() uint64 {
	f := c.raft.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	return f.Index()
}

// askVoters asks every other member, at once, for the cluster's voters;
// the first answer of a node that hears from a leader counts.
func (c *Cluster) askVoters(ctx context.Context) ([]string, bool) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timing.RejoinInterval)
	defer cancel()
	var names []string
	for _, name := range c.gossip.memberNames() {
		if name != c.self {
			names = append(names, name)
		}
	}
	answers := make(chan ForwardReply, len(names))
	for _, name := range names {
		go func() {
			reply, err := c.cfg.Forward(ctx, name, ForwardRequest{Kind: KindVoters, From: c.self})
			if err != nil || reply.Err() != nil || !reply.Quorum {
				reply = ForwardReply{}
			}
			answers <- reply
		}()
	}
	for range names {
		if r := <-answers; r.Quorum {
			return r.Voters, true
		}
	}
	return nil, false
}

// votersReply is this node's answer to KindVoters: the voters of its
// configuration, and whether it hears from a leader (only then does the
// asker trust it).
func (c *Cluster) votersReply() ForwardReply {
	voters, ok := c.configVoters()
	standing, _, _ := c.member.get()
	return ForwardReply{Voters: voters, Quorum: ok && standing == "" && c.hasLeader(time.Time{})}
}

// tellRemoved tells the node just removed that it is no longer a voter,
// and who the voters are. It is best effort and short: a node that does
// not answer at once finds out by asking (watchMembership).
func (c *Cluster) tellRemoved(ctx context.Context, name string) {
	voters, ok := c.configVoters()
	if !ok || slices.Contains(voters, name) {
		return
	}
	if name == c.self {
		// The leader removed itself: it needs no message, and would
		// refuse its own, from a node that is no voter any more.
		c.learnVoters(voters)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := c.cfg.Forward(ctx, name, ForwardRequest{Kind: KindRemoved, From: c.self, Voters: voters}); err != nil {
		c.logger.Debug("tell the removed node", "node", name, "err", err)
	}
}
