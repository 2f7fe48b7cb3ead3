package transport

// FuzzControlRequest: whatever bytes a client of the control API sends as
// the message of a method, the server's codec decodes them and the
// method's handler hands the node a request of the method's type, or the
// call fails before the node sees anything. Its committed seed corpus
// (testdata/fuzz/FuzzControlRequest) holds a request of every method, as
// replctl and the nodes send them, and edge cases.
//
//	go test -run '^$' -fuzz '^FuzzControlRequest$' ./transport

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"

	"github.com/replvol/replvol/internal/fuzzseed"
)

// recordingControl is a ControlServer that records the requests it gets.
type recordingControl struct{ got []any }

func record[Req, Resp any](c *recordingControl, r *Req) (*Resp, error) {
	c.got = append(c.got, r)
	return new(Resp), nil
}

func (c *recordingControl) NodeStatus(_ context.Context, r *StatusRequest) (*NodeStatus, error) {
	return record[StatusRequest, NodeStatus](c, r)
}

func (c *recordingControl) ClusterStatus(_ context.Context, r *StatusRequest) (*ClusterStatus, error) {
	return record[StatusRequest, ClusterStatus](c, r)
}

func (c *recordingControl) Primary(_ context.Context, r *PrimaryRequest) (*PrimaryReply, error) {
	return record[PrimaryRequest, PrimaryReply](c, r)
}

func (c *recordingControl) Demote(_ context.Context, r *DemoteRequest) (*DemoteReply, error) {
	return record[DemoteRequest, DemoteReply](c, r)
}

func (c *recordingControl) Promote(_ context.Context, r *PromoteRequest) (*PromoteReply, error) {
	return record[PromoteRequest, PromoteReply](c, r)
}

func (c *recordingControl) Connect(_ context.Context, r *ConnectRequest) (*ConnectReply, error) {
	return record[ConnectRequest, ConnectReply](c, r)
}

func (c *recordingControl) Disconnect(_ context.Context, r *ConnectRequest) (*ConnectReply, error) {
	return record[ConnectRequest, ConnectReply](c, r)
}

func (c *recordingControl) Resync(_ context.Context, r *ResyncRequest) (*ResyncReply, error) {
	return record[ResyncRequest, ResyncReply](c, r)
}

func (c *recordingControl) PathAction(_ context.Context, r *PathRequest) (*PathReply, error) {
	return record[PathRequest, PathReply](c, r)
}

func (c *recordingControl) Verify(_ context.Context, r *VerifyRequest) (*VerifyReply, error) {
	return record[VerifyRequest, VerifyReply](c, r)
}

func (c *recordingControl) ClusterForward(_ context.Context, r *ClusterMessage) (*ClusterMessage, error) {
	return record[ClusterMessage, ClusterMessage](c, r)
}

func (c *recordingControl) Membership(_ context.Context, r *MembershipRequest) (*MembershipReply, error) {
	return record[MembershipRequest, MembershipReply](c, r)
}

func (c *recordingControl) Adjust(_ context.Context, r *AdjustRequest) (*AdjustReply, error) {
	return record[AdjustRequest, AdjustReply](c, r)
}

func (c *recordingControl) Resize(_ context.Context, r *ResizeRequest) (*ResizeReply, error) {
	return record[ResizeRequest, ResizeReply](c, r)
}

func (c *recordingControl) Claim(_ context.Context, r *ClaimRequest) (*ClaimReply, error) {
	return record[ClaimRequest, ClaimReply](c, r)
}

func (c *recordingControl) VolumeCreate(_ context.Context, r *VolumeCreateRequest) (*VolumeCreateReply, error) {
	return record[VolumeCreateRequest, VolumeCreateReply](c, r)
}

func (c *recordingControl) VolumeDelete(_ context.Context, r *VolumeDeleteRequest) (*VolumeDeleteReply, error) {
	return record[VolumeDeleteRequest, VolumeDeleteReply](c, r)
}

func (c *recordingControl) VolumeList(_ context.Context, r *VolumeListRequest) (*VolumeListReply, error) {
	return record[VolumeListRequest, VolumeListReply](c, r)
}

func (c *recordingControl) Pools(_ context.Context, r *PoolsRequest) (*PoolsReply, error) {
	return record[PoolsRequest, PoolsReply](c, r)
}

func (c *recordingControl) AwaitServing(_ context.Context, r *AwaitServingRequest) (*AwaitServingReply, error) {
	return record[AwaitServingRequest, AwaitServingReply](c, r)
}

func (c *recordingControl) Scrub(_ context.Context, r *ScrubRequest) (*ScrubReply, error) {
	return record[ScrubRequest, ScrubReply](c, r)
}

func (c *recordingControl) ReadBlocks(_ context.Context, r *ReadBlocksRequest) (*ReadBlocksReply, error) {
	return record[ReadBlocksRequest, ReadBlocksReply](c, r)
}

func (c *recordingControl) Events(_ context.Context, r *EventsRequest, _ func(*Event) error) error {
	c.got = append(c.got, r)
	return nil
}

// bodyStream is the server side of an Events call whose client sent body.
type bodyStream struct {
	grpc.ServerStream
	body []byte
}

func (s bodyStream) Context() context.Context { return context.Background() }
func (s bodyStream) RecvMsg(m any) error {
	return jsonCodec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(s.body)}, m)
}
func (s bodyStream) SendMsg(any) error { return nil }

// controlMethods names the unary methods, then Events, in the order the
// fuzz target's method number picks them.
func controlMethods() []string {
	var names []string
	for _, m := range controlDesc.Methods {
		names = append(names, m.MethodName)
	}
	return append(names, controlDesc.Streams[0].StreamName)
}

// controlSeed is one seed of FuzzControlRequest.
type controlSeed struct {
	method uint16
	body   []byte
}

// seedControlRequests: a request of every method as replctl and the nodes
// send them, and edge cases of the JSON.
func seedControlRequests() []controlSeed {
	requests := map[string]any{
		"NodeStatus":     &StatusRequest{Events: 20},
		"ClusterStatus":  &StatusRequest{},
		"Primary":        &PrimaryRequest{Volume: "vol0", Node: "beta", Timeout: 30 * time.Second, Force: true, Yes: true},
		"Demote":         &DemoteRequest{Volume: "vol0", To: "beta", Timeout: time.Minute},
		"Promote":        &PromoteRequest{Volume: "vol0", Epoch: 7, Generation: "0102030405060708090a0b0c0d0e0f10", Retake: true},
		"Connect":        &ConnectRequest{Volume: "vol0", Node: "beta", DiscardMyData: true},
		"Disconnect":     &ConnectRequest{Volume: "vol0", Node: "alpha"},
		"Resync":         &ResyncRequest{Volume: "vol0", Node: "beta", Pause: true},
		"PathAction":     &PathRequest{Volume: "vol0", Action: "policy", Policy: "round-robin"},
		"Verify":         &VerifyRequest{Volume: "vol0", Repair: true},
		"ClusterForward": &ClusterMessage{Body: []byte(`{"kind":"renew-lease","from":"alpha","volume":"vol0","epoch":3}`)},
		"Membership":     &MembershipRequest{Node: "witness", Remove: true},
		"Adjust":         &AdjustRequest{Volume: "vol0", Protocol: "B", OnCongestion: "pull-ahead"},
		"Resize":         &ResizeRequest{Volume: "vol0", Size: 256 << 20, Node: "beta", Check: true},
		"Claim":          &ClaimRequest{Volume: "vol0", Action: ClaimTake, Holder: MountHolder{Host: "web1", Dir: "/srv/data", ID: "5f0c2a"}, Grace: time.Minute},
		"AwaitServing":   &AwaitServingRequest{Volume: "vol0", Epoch: 8},
		"Scrub":          &ScrubRequest{Volume: "vol0", Node: "beta", Rate: 50 << 20},
		"ReadBlocks":     &ReadBlocksRequest{Volume: "vol0", Offset: 4096, Length: 8192},
		"VolumeCreate":   &VolumeCreateRequest{Name: "pvc-1", Size: 1 << 30, Replicas: 2, Pool: "default", Protocol: "C"},
		"VolumeDelete":   &VolumeDeleteRequest{Name: "pvc-1"},
		"VolumeList":     &VolumeListRequest{},
		"Pools":          &PoolsRequest{Node: "beta"},
		"Events":         &EventsRequest{History: 100, Since: time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC), State: true},
	}
	var seeds []controlSeed
	for i, name := range controlMethods() {
		body, err := json.Marshal(requests[name])
		if err != nil {
			panic(err)
		}
		seeds = append(seeds, controlSeed{uint16(i), body})
	}
	events := uint16(len(controlDesc.Methods))
	return append(seeds,
		controlSeed{uint16(0), []byte(nil)},
		controlSeed{uint16(2), []byte(`{"volume":"vol0","node":"beta","timeout":-1,"force":true,"yes":true}`)},
		controlSeed{uint16(4), []byte(`{"epoch":-1}`)},
		controlSeed{uint16(10), []byte(`{"body":"not base64"}`)},
		controlSeed{events, []byte(`{"since":"10000-01-01T00:00:00Z"}`)},
		controlSeed{events, []byte(`{"since":"2025-01-02T03:04:05+23:59","history":-5}`)},
		controlSeed{uint16(14), []byte(`{"volume":"vol0","action":"take","holder":{"host":"","dir":"relative","id":""},"grace":-1}`)},
		controlSeed{uint16(13), []byte(`{"volume":"vol0","size":-4096}`)},
		controlSeed{uint16(1), []byte("\x00\x00\x00\x00\x05hello")},
		controlSeed{uint16(65535), []byte(`[]`)},
	)
}

// FuzzControlRequest: the node gets a request of the method's type
// exactly when the bytes decode, and what it gets encodes to JSON that
// decodes to a request of the same encoding.
func FuzzControlRequest(f *testing.F) {
	for _, s := range seedControlRequests() {
		f.Add(s.method, s.body)
	}
	methods := controlMethods()
	f.Fuzz(func(t *testing.T, method uint16, body []byte) {
		srv := &recordingControl{}
		i := int(method) % len(methods)
		decode := func(v any) error {
			return jsonCodec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(body)}, v)
		}
		var want reflect.Type
		var err error
		if i < len(controlDesc.Methods) {
			_, err = controlDesc.Methods[i].Handler(srv, context.Background(), decode, nil)
			want = reflect.TypeOf(controlDesc.HandlerType).Elem()
			m, _ := want.MethodByName(methods[i])
			want = m.Type.In(1)
		} else {
			err = controlDesc.Streams[0].Handler(srv, bodyStream{body: body})
			want = reflect.TypeFor[*EventsRequest]()
		}
		if err != nil {
			if len(srv.got) != 0 {
				t.Fatalf("%s: the node got %+v from a call that failed: %v", methods[i], srv.got[0], err)
			}
			return
		}
		if len(srv.got) != 1 || reflect.TypeOf(srv.got[0]) != want {
			t.Fatalf("%s: the node got %#v, want one %v", methods[i], srv.got, want)
		}
		enc, err := json.Marshal(srv.got[0])
		if err != nil {
			t.Fatalf("%s: %+v does not encode: %v", methods[i], srv.got[0], err)
		}
		again := reflect.New(want.Elem()).Interface()
		if err := json.Unmarshal(enc, again); err != nil {
			t.Fatalf("%s: %s does not decode: %v", methods[i], enc, err)
		}
		if enc2, _ := json.Marshal(again); !bytes.Equal(enc2, enc) {
			t.Fatalf("%s: %s decodes to a request that encodes to %s", methods[i], enc, enc2)
		}
	})
}

// TestFuzzSeedCorpus keeps FuzzControlRequest's committed corpus the seeds
// above (go test -run TestFuzzSeedCorpus -write-fuzz-seeds rewrites it).
func TestFuzzSeedCorpus(t *testing.T) {
	var seeds []fuzzseed.Seed
	for _, s := range seedControlRequests() {
		seeds = append(seeds, fuzzseed.Seed{s.method, s.body})
	}
	fuzzseed.Sync(t, "FuzzControlRequest", seeds, fuzzseed.Exact)
}
