package node

import (
	"fmt"
	"sort"

	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// startVerify starts a verify of every peer that is connected and in sync.
func (v *Volume) startVerify(repair bool) (*transport.VerifyReply, error) {
	reply := &transport.VerifyReply{Primary: v.self}
	for _, p := range v.streamingPeers() {
		s := p.session()
		if s == nil || !p.connected() {
			continue
		}
		if !p.verifying.CompareAndSwap(false, true) {
			return nil, status.Errorf(codes.FailedPrecondition, "a verify of %s is already running", p.name)
		}
		reply.Peers = append(reply.Peers, p.name)
		v.bg.Add(1)
		go func() {
			defer v.bg.Done()
			defer p.verifying.Store(false)
			p.verify(s, repair)
		}()
	}
	if len(reply.Peers) == 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "no secondary of %s is connected (and not resyncing): nothing to verify against", v.name)
	}
	sort.Strings(reply.Peers)
	v.node.event(v.name, "verify", fmt.Sprintf("online verify started against %v (repair %v)", reply.Peers, repair))
	return reply, nil
}
