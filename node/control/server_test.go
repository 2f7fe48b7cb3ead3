package control

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/clock"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeNode is a node of two (alpha, this one, and beta) that holds no
// volume itself; the cluster's config names vol0 on both. It records
// whether a request reached a decision of the node's.
type fakeNode struct {
	decided []string
	// stateAt is the time StateEvents was last asked for.
	stateAt time.Time
	// created are the creates the node was asked for.
	created []transport.VolumeCreateRequest
}

func (f *fakeNode) Name() string { return "alpha" }

func (f *fakeNode) Peer(name string) (transport.ControlServer, error) {
	return nil, fmt.Errorf("no node %q in the config", name)
}

func (f *fakeNode) AwaitVolume(_ context.Context, name string) (Volume, error) {
	return f.Volume(name)
}

func (f *fakeNode) Volume(name string) (Volume, error) {
	return nil, fmt.Errorf("%w: node alpha holds no volume %q (it holds: )", ErrNotFound, name)
}

func (f *fakeNode) Disks(volume string) ([]string, bool) {
	if volume != "vol0" {
		return nil, false
	}
	return []string{"alpha", "beta"}, true
}

func (f *fakeNode) NBDURI(volume string) string                 { return "nbd://alpha/" + volume }
func (f *fakeNode) NodeStatus(events int) *transport.NodeStatus { return &transport.NodeStatus{} }

func (f *fakeNode) ClusterStatus(ctx context.Context, events int) (*transport.ClusterStatus, error) {
	// vol0 has no reachable primary.
	return &transport.ClusterStatus{Volumes: []transport.VolumeStatus{{Name: "vol0", Primary: "beta"}}}, nil
}

func (f *fakeNode) Subscribe() (<-chan transport.Event, func()) { return nil, func() {} }
func (f *fakeNode) History(max int) ([]transport.Event, error)  { return nil, nil }
func (f *fakeNode) StateEvents(now time.Time) []transport.Event {
	f.stateAt = now
	return []transport.Event{{Time: now, Kind: "state"}}
}

func (f *fakeNode) Switchover(ctx context.Context, r *transport.PrimaryRequest) (*transport.PrimaryReply, error) {
	f.decided = append(f.decided, "switchover")
	return &transport.PrimaryReply{Volume: r.Volume, Primary: r.Node}, nil
}

func (f *fakeNode) Membership(ctx context.Context, r *transport.MembershipRequest) (*transport.MembershipReply, error) {
	f.decided = append(f.decided, "membership")
	return &transport.MembershipReply{}, nil
}

func (f *fakeNode) Claim(ctx context.Context, r *transport.ClaimRequest) (*transport.ClaimReply, error) {
	f.decided = append(f.decided, "claim")
	return &transport.ClaimReply{Volume: r.Volume, Node: "alpha"}, nil
}

func (f *fakeNode) Leader() (string, bool) { return "alpha", true }

func (f *fakeNode) LeaderChanged() <-chan struct{} { return nil }

func (f *fakeNode) DataNodes() []string { return []string{"alpha"} }

func (f *fakeNode) Pools() []transport.PoolStatus { return nil }

func (f *fakeNode) CreateVolume(ctx context.Context, r *transport.VolumeCreateRequest) (*transport.VolumeCreateReply, error) {
	f.decided = append(f.decided, "create")
	f.created = append(f.created, *r)
	return &transport.VolumeCreateReply{Volume: transport.VolumeInfo{Name: r.Name, Size: r.Size}, Created: true}, nil
}

func (f *fakeNode) DeleteVolume(ctx context.Context, name string) (*transport.VolumeDeleteReply, error) {
	f.decided = append(f.decided, "delete")
	return &transport.VolumeDeleteReply{}, nil
}

func (f *fakeNode) ListVolumes(context.Context) ([]transport.VolumeInfo, error) { return nil, nil }

func (f *fakeNode) ClusterMessage(ctx context.Context, body []byte, sender func(from string) error) ([]byte, error) {
	f.decided = append(f.decided, "cluster message")
	return nil, nil
}

// TestTheHandlersCheckTheRequestBeforeTheNodeDecides: a request the
// control API can tell is wrong (a volume the cluster lacks, a node that
// holds no disk of it, a size or a generation that is not one, a node the
// config does not name) is answered with the code the CLI acts on, and
// reaches no decision of the node's.
func TestTheHandlersCheckTheRequestBeforeTheNodeDecides(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		call  func(s *Server) error
		code  codes.Code
		words string
	}{
		{"a switchover of a volume the cluster lacks", func(s *Server) error {
			_, err := s.Primary(ctx, &transport.PrimaryRequest{Volume: "nope", Node: "beta"})
			return err
		}, codes.NotFound, `no volume "nope" in the cluster`},
		{"a switchover to a node that holds no disk of the volume", func(s *Server) error {
			_, err := s.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "gamma"})
			return err
		}, codes.InvalidArgument, "choose one of the nodes in volumes[].disks"},
		{"a resize to a size that is not a multiple of 4096", func(s *Server) error {
			_, err := s.Resize(ctx, &transport.ResizeRequest{Volume: "vol0", Size: 4097})
			return err
		}, codes.InvalidArgument, "want a positive multiple of 4096 bytes"},
		{"a resize on a node that holds no disk of the volume", func(s *Server) error {
			_, err := s.Resize(ctx, &transport.ResizeRequest{Volume: "vol0", Size: 8192, Node: "gamma"})
			return err
		}, codes.NotFound, `node "gamma" holds no disk of vol0`},
		{"a disconnect forwarded to a node the config does not name", func(s *Server) error {
			_, err := s.Disconnect(ctx, &transport.ConnectRequest{Volume: "vol0", Node: "gamma"})
			return err
		}, codes.NotFound, `no node "gamma" in the config`},
		{"a connect of a volume this node does not hold", func(s *Server) error {
			_, err := s.Connect(ctx, &transport.ConnectRequest{Volume: "vol0"})
			return err
		}, codes.NotFound, "holds no volume"},
		{"a promotion of a volume this node does not hold", func(s *Server) error {
			_, err := s.Promote(ctx, &transport.PromoteRequest{Volume: "vol0", Generation: "not a generation"})
			return err
		}, codes.NotFound, "holds no volume"},
		{"a resync of a volume with no reachable primary", func(s *Server) error {
			_, err := s.Resync(ctx, &transport.ResyncRequest{Volume: "vol0"})
			return err
		}, codes.FailedPrecondition, "vol0 has no reachable primary to resync from"},
		{"a verify of a volume the cluster lacks", func(s *Server) error {
			_, err := s.Verify(ctx, &transport.VerifyRequest{Volume: "nope"})
			return err
		}, codes.NotFound, `no volume "nope" in the cluster`},
		{"a mount claim of a volume the cluster lacks", func(s *Server) error {
			_, err := s.Claim(ctx, &transport.ClaimRequest{Volume: "nope", Action: transport.ClaimTake, Holder: transport.MountHolder{Host: "h", Dir: "/mnt", ID: "1"}})
			return err
		}, codes.NotFound, `no volume "nope" in the cluster`},
		{"a mount claim that names no holder", func(s *Server) error {
			_, err := s.Claim(ctx, &transport.ClaimRequest{Volume: "vol0", Action: transport.ClaimTake, Holder: transport.MountHolder{ID: "1"}})
			return err
		}, codes.InvalidArgument, "a claim names its holder"},
		{"a mount claim without the holder's ID", func(s *Server) error {
			_, err := s.Claim(ctx, &transport.ClaimRequest{Volume: "vol0", Action: transport.ClaimRelease, Holder: transport.MountHolder{Host: "h", Dir: "/mnt"}})
			return err
		}, codes.InvalidArgument, "a claim needs the holder's ID"},
		{"a mount claim of an unknown action", func(s *Server) error {
			_, err := s.Claim(ctx, &transport.ClaimRequest{Volume: "vol0", Action: "steal", Holder: transport.MountHolder{Host: "h", Dir: "/mnt", ID: "1"}})
			return err
		}, codes.InvalidArgument, `claim action "steal"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := &fakeNode{}
			err := tc.call(NewServer(node, NewGate("alpha", nil, nil, nil), nil))
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.words) {
				t.Fatalf("got %v; want %s saying %q", err, tc.code, tc.words)
			}
			if len(node.decided) > 0 {
				t.Fatalf("the node decided %v", node.decided)
			}
		})
	}
}

// TestASwitchoverTheRequestAllowsIsTheNodesToDecide: once the volume and
// the target check out, the handler hands the switchover to the node.
func TestASwitchoverTheRequestAllowsIsTheNodesToDecide(t *testing.T) {
	node := &fakeNode{}
	s := NewServer(node, NewGate("alpha", nil, nil, nil), nil)
	if _, err := s.Primary(context.Background(), &transport.PrimaryRequest{Volume: "vol0", Node: "beta"}); err != nil {
		t.Fatal(err)
	}
	if len(node.decided) != 1 || node.decided[0] != "switchover" {
		t.Fatalf("the node decided %v", node.decided)
	}
}

// TestTheStateEventsAreAtTheInjectedClocksNow: an events request that asks
// for the current state gets the node's state at the server's clock's now.
func TestTheStateEventsAreAtTheInjectedClocksNow(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	node := &fakeNode{}
	s := NewServer(node, NewGate("alpha", nil, nil, nil), fake)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got []transport.Event
	err := s.Events(ctx, &transport.EventsRequest{State: true}, func(e *transport.Event) error {
		got = append(got, *e)
		cancel() // the state is all this test waits for
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !node.stateAt.Equal(fake.Now()) || len(got) != 1 || !got[0].Time.Equal(fake.Now()) {
		t.Fatalf("the state was asked for at %v and sent as %+v; want both at the injected clock's %v", node.stateAt, got, fake.Now())
	}
}
