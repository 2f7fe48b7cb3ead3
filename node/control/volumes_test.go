package control

import (
	"context"
	"strings"
	"testing"

	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestVolumeCreateFillsInItsDefaults: a create names only what differs
// from the defaults (2 replicas, pool default, protocol C), and a size
// is rounded up to a whole 4 KiB block, as the node then records it.
func TestVolumeCreateFillsInItsDefaults(t *testing.T) {
	node := &fakeNode{}
	s := NewServer(node, nil, nil)
	reply, err := s.VolumeCreate(context.Background(), &transport.VolumeCreateRequest{Name: "pvc-1", Size: 10<<20 + 1})
	if err != nil {
		t.Fatal(err)
	}
	want := transport.VolumeCreateRequest{Name: "pvc-1", Size: 10<<20 + 4096, Replicas: 2, Pool: "default", Protocol: "C"}
	if len(node.created) != 1 {
		t.Fatalf("the node was asked for %+v, want %+v", node.created, want)
	}
	asked := node.created[0]
	if len(asked.RequestID) != 32 {
		t.Fatalf("the node was asked with request ID %q, want one chosen for a caller that gave none", asked.RequestID)
	}
	asked.RequestID = ""
	if asked != want {
		t.Fatalf("the node was asked for %+v, want %+v", node.created, want)
	}
	// A caller's own ID is passed on as it is.
	if _, err := s.VolumeCreate(context.Background(), &transport.VolumeCreateRequest{Name: "pvc-1", Size: 4096, RequestID: "replctl-7f3a"}); err != nil {
		t.Fatal(err)
	}
	if got := node.created[1].RequestID; got != "replctl-7f3a" {
		t.Fatalf("the node was asked with request ID %q, want the caller's replctl-7f3a", got)
	}
	if reply.Volume.Size != want.Size {
		t.Fatalf("reply %+v", reply)
	}
}

// TestBadVolumeCreatesAreRefusedBeforeTheNode: a request no node can
// take is InvalidArgument, says what is wrong, and reaches no node.
func TestBadVolumeCreatesAreRefusedBeforeTheNode(t *testing.T) {
	for _, c := range []struct {
		name string
		req  transport.VolumeCreateRequest
	}{
		{"no name", transport.VolumeCreateRequest{Size: 4096}},
		{"a name with a slash", transport.VolumeCreateRequest{Name: "a/b", Size: 4096}},
		{"no size", transport.VolumeCreateRequest{Name: "v"}},
		{"negative replicas", transport.VolumeCreateRequest{Name: "v", Size: 4096, Replicas: -1}},
		{"no such protocol", transport.VolumeCreateRequest{Name: "v", Size: 4096, Protocol: "D"}},
		{"a pool name with a dot", transport.VolumeCreateRequest{Name: "v", Size: 4096, Pool: "../x"}},
		{"a request ID with a space", transport.VolumeCreateRequest{Name: "v", Size: 4096, RequestID: "a b"}},
		{"a request ID of 65 characters", transport.VolumeCreateRequest{Name: "v", Size: 4096, RequestID: strings.Repeat("a", 65)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			node := &fakeNode{}
			_, err := NewServer(node, nil, nil).VolumeCreate(context.Background(), &c.req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("got %v, want InvalidArgument", err)
			}
			if len(node.decided) != 0 {
				t.Fatalf("the node was asked: %v", node.decided)
			}
		})
	}
}

// abortingNode leads, but loses its office during its first aborts
// creates (Aborted), each time announcing a leader change.
type abortingNode struct {
	fakeNode
	aborts int
}

func (a *abortingNode) LeaderChanged() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

func (a *abortingNode) CreateVolume(ctx context.Context, r *transport.VolumeCreateRequest) (*transport.VolumeCreateReply, error) {
	a.decided = append(a.decided, "create")
	if a.aborts > 0 {
		a.aborts--
		return nil, status.Error(codes.Aborted, "pvc-1: the raft leader changed")
	}
	return &transport.VolumeCreateReply{Volume: transport.VolumeInfo{Name: r.Name}, Created: true}, nil
}

// TestAVolumeCallIsAskedAgainWhenTheLeaderLosesItsOffice: a leader that
// lost its office while it recorded a create answers Aborted; the call
// is made again on the leader after it, and the caller sees only the
// answer of the one that took it.
func TestAVolumeCallIsAskedAgainWhenTheLeaderLosesItsOffice(t *testing.T) {
	node := &abortingNode{aborts: 2}
	reply, err := NewServer(node, nil, nil).VolumeCreate(context.Background(), &transport.VolumeCreateRequest{Name: "pvc-1", Size: 4096})
	if err != nil || !reply.Created || len(node.decided) != 3 {
		t.Fatalf("got %+v, %v after %d creates; want the third one's answer", reply, err, len(node.decided))
	}
}
