package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/replvol/replvol/replication"
)

// TestForwardErrorsKeepTheirClass: every error class the leader can
// return crosses a forward (as JSON, as the node layer carries it) and
// still matches its sentinel with errors.Is, with its text intact; an
// error of no known class keeps its text.
func TestForwardErrorsKeepTheirClass(t *testing.T) {
	va := replication.VolumeAuthority{Primary: "a", Epoch: 3}
	roundTrip := func(err error) ForwardReply {
		raw, jerr := json.Marshal(replyOf(va, err))
		if jerr != nil {
			t.Fatal(jerr)
		}
		var back ForwardReply
		if jerr := json.Unmarshal(raw, &back); jerr != nil {
			t.Fatal(jerr)
		}
		return back
	}
	for _, e := range errorCodes {
		sent := fmt.Errorf("volume %q: %w", "vol", e.err)
		back := roundTrip(sent)
		if got := back.Err(); !errors.Is(got, e.err) || got.Error() != sent.Error() || back.Volume.Epoch != 3 {
			t.Errorf("%s came back as %v (%+v)", e.code, got, back)
		}
	}
	if back := roundTrip(nil); back.Err() != nil {
		t.Errorf("success came back as %v", back.Err())
	}
	if got := roundTrip(errors.New("disk on fire")).Err(); got == nil || got.Error() != "disk on fire" {
		t.Errorf("an unclassed error came back as %v", got)
	}
}

// TestAForwardedRequestOfANonVoterChangesNothing: a request forwarded in
// the name of a node that is no voter (a node of the CA never added, or
// removed; the node layer binds the name to the call's certificate) is
// refused, whatever it asks: a promotion, a lease, a membership change,
// or telling a voter it was removed. It changes nothing, and each
// refusal is logged once per sender and kind. Anyone may still ask for
// the voters (a removed node does), and a voter's requests go through.
func TestAForwardedRequestOfANonVoterChangesNothing(t *testing.T) {
	n, leader := threeNodes(t)
	follower := n.follower(t, leader)
	ctx := testContext(t, 10*time.Second)
	before := leader.Authority()
	promote := replication.PromoteCommand("vol", 1, "b", false)
	refused := []struct {
		to  *Cluster
		req ForwardRequest
	}{
		{leader, ForwardRequest{Kind: KindPropose, From: "x", Command: &promote}},
		{leader, ForwardRequest{Kind: KindRenewLeases, From: "x", Leases: []LeaseClaim{{Volume: "vol", Epoch: 1}}}},
		{leader, ForwardRequest{Kind: KindReleaseLease, From: "x", Volume: "vol", Epoch: 1}},
		{leader, ForwardRequest{Kind: KindRemoveVoter, From: "x", Member: &Member{Name: "w"}}},
		{leader, ForwardRequest{Kind: KindPropose, Command: &promote}},
		{follower, ForwardRequest{Kind: KindRemoved, From: "x", Voters: []string{"x"}}},
	}
	for range 2 {
		for _, r := range refused {
			if err := r.to.HandleForward(ctx, r.req).Err(); !errors.Is(err, ErrSenderNotAVoter) {
				t.Fatalf("%s from %q to %s: %v, want ErrSenderNotAVoter", r.req.Kind, r.req.From, r.to.self, err)
			}
		}
	}
	if got := leader.Authority(); !reflect.DeepEqual(got, before) {
		t.Fatalf("the authority changed: %+v, before %+v", got, before)
	}
	if s := follower.Status(); s.Standing != "" || !slices.Equal(s.Voters, []string{"a", "b", "w"}) {
		t.Fatalf("%s after x told it it was removed: standing %q, voters %v", follower.self, s.Standing, s.Voters)
	}
	if s := leader.Status(); !slices.Equal(s.Voters, []string{"a", "b", "w"}) {
		t.Fatalf("the voters after x asked to remove w: %v", s.Voters)
	}
	if reply := leader.HandleForward(ctx, ForwardRequest{Kind: KindVoters, From: "x"}); reply.Err() != nil || !slices.Equal(reply.Voters, []string{"a", "b", "w"}) {
		t.Fatalf("x asked for the voters: %+v", reply)
	}
	if _, err := follower.Propose(ctx, replication.MarkOutdatedCommand("vol", 1, "b")); err != nil {
		t.Fatalf("a voter's proposal: %v", err)
	}
	logs := n.logsOf(leader.self)
	for _, kind := range []ForwardKind{KindPropose, KindRenewLeases, KindReleaseLease, KindRemoveVoter} {
		if got := count(logs, fmt.Sprintf(`cluster: refused a forwarded %s request from \"x\": it is not a voter of this node's raft configuration (voters: a, b, w)`, kind)); got != 1 {
			t.Errorf("%s logged the refusal of x's %s %d times, want once:\n%s", leader.self, kind, got, strings.Join(logs, "\n"))
		}
	}
	if got := count(logs, "cluster: refused a forwarded propose request that names no sender"); got != 1 {
		t.Errorf("%s logged the refusal of a request without a sender %d times, want once:\n%s", leader.self, got, strings.Join(logs, "\n"))
	}
}

// unanswered is a raft future raft never answers, as one it took before
// its shutdown may be (hashicorp/raft issue 498).
type unanswered struct{ raft.Future }

func (unanswered) Error() error { select {} }

// TestAWaitForAFutureRaftNeverAnswersEndsWhenTheClusterCloses: a
// proposal whose context has no deadline still ends, as of unknown
// outcome and closed, when its cluster closes.
func TestAWaitForAFutureRaftNeverAnswersEndsWhenTheClusterCloses(t *testing.T) {
	ctx, closeCluster := context.WithCancel(context.Background())
	c := &Cluster{ctx: ctx}
	done := make(chan error, 1)
	go func() { done <- c.waitFuture(context.Background(), unanswered{}) }()
	select {
	case err := <-done:
		t.Fatalf("the wait ended before the cluster closed: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	closeCluster()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) || !errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("the wait ended with %v, want ErrClosed and ErrOutcomeUnknown", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wait went on after the cluster closed")
	}
}
