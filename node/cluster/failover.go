package cluster

import (
	"time"

	"github.com/replvol/replvol/node/failover"
	"github.com/replvol/replvol/replication"
)

// The leader's failover rule and the plain types it reads live in
// node/failover, which imports no raft, memberlist or bbolt (the
// simulation runs it). The cluster names them here for its callers, as
// the same types: new code may take them from either package.

type (
	Status         = failover.Status
	MemberState    = failover.MemberState
	Liveness       = failover.Liveness
	Standing       = failover.Standing
	Reason         = failover.Reason
	Renewal        = failover.Renewal
	Renewals       = failover.Renewals
	Term           = failover.Term
	FailoverConfig = failover.FailoverConfig
	Leader         = failover.Leader
	Proposal       = failover.Proposal
	LeftAlone      = failover.LeftAlone
	Decision       = failover.Decision
	Watch          = failover.Watch
	PrimaryWatch   = failover.PrimaryWatch
	PrimaryVerdict = failover.PrimaryVerdict
)

// Liveness values.
const (
	Alive   = failover.Alive
	Dead    = failover.Dead
	Left    = failover.Left
	Unknown = failover.Unknown
)

// Standings.
const (
	Removed = failover.Removed
	Joining = failover.Joining
)

// Reasons.
const (
	NotLeading          = failover.NotLeading
	FailoverOff         = failover.FailoverOff
	NoPrimary           = failover.NoPrimary
	PrimaryRenewing     = failover.PrimaryRenewing
	PrimaryRenewed      = failover.PrimaryRenewed
	NoUpToDateCandidate = failover.NoUpToDateCandidate
	CandidateOutdated   = failover.CandidateOutdated
	PrimaryGone         = failover.PrimaryGone
	PrimaryCutOff       = failover.PrimaryCutOff
)

// Times of the rule.
const (
	LeadershipSettle = failover.LeadershipSettle
	UnknownGrace     = failover.UnknownGrace
)

// Decide is failover.Decide.
func Decide(volumes []string, authority replication.Authority, members Status, renewals Renewals, leader Leader, now time.Time) Decision {
	return failover.Decide(volumes, authority, members, renewals, leader, now)
}

// FailoverNow is failover.FailoverNow.
func FailoverNow(st Status, cfg FailoverConfig) (auto bool, why string) {
	return failover.FailoverNow(st, cfg)
}

// AutoFailover is failover.AutoFailover.
func AutoFailover(voters []string) (ok bool, why string) { return failover.AutoFailover(voters) }

// StarvedAfter is failover.StarvedAfter.
func StarvedAfter(lease time.Duration) time.Duration { return failover.StarvedAfter(lease) }
