package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/replvol/replvol/internal/volmount"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// claimer asks a volume's primary for a mount's claim (volmount.Claimer), at the control
// address the record keeps (replctl mount's --addr), with the operator's certificate from
// its --tls-dir (none through a unix socket). Each call is bounded by timeout.
type claimer struct{ timeout time.Duration }

var _ volmount.Claimer = claimer{}

func (c claimer) Claim(ctx context.Context, action volmount.ClaimAction, rec *volmount.Record) error {
	cl := rec.Claim
	client, err := (&globals{tlsDir: cl.TLSDir}).dialControl(cl.Addr)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	_, err = client.Claim(ctx, &transport.ClaimRequest{Volume: rec.Volume, Action: string(action),
		Holder: transport.MountHolder{Host: cl.Host, Dir: rec.Dir, ID: cl.ID, Follows: rec.Follow}, Grace: cl.Grace})
	return claimError(err, action, rec)
}

// claimError puts a failed claim call into words: the primary's own refusal as it said it, or
// why it could not be asked.
func claimError(err error, action volmount.ClaimAction, rec *volmount.Record) error {
	if err == nil {
		return nil
	}
	node := rec.Claim.Node
	if node == "" {
		node = "the primary"
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s the mount claim of %s on %s (%s): %w", action, rec.Volume, node, rec.Claim.Addr, err)
	}
	switch st.Code() {
	case codes.FailedPrecondition, codes.NotFound, codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated:
		return errors.New(st.Message())
	case codes.Unimplemented:
		return fmt.Errorf("%s (%s) does not know mount claims: it runs an older replnode; upgrade it to mount %s", node, rec.Claim.Addr, rec.Volume)
	}
	return unreachableError(fmt.Errorf("could not %s the mount claim of %s on %s (%s): %s", action, rec.Volume, node, rec.Claim.Addr, plainMessage(st.Message())))
}

// giveBackTimeout bounds replctl umount's call that gives a claim back: a primary that is
// down must not hold up an on_demote hook.
const giveBackTimeout = 10 * time.Second

// giveBack gives rec's claim back to the primary, and says so, or why not: for a following
// mount, the primary it followed last (following, nil when it said none).
func giveBack(ctx context.Context, rec *volmount.Record, following *volmount.Following) string {
	if following != nil && following.Control != "" {
		c := *rec.Claim
		c.Node, c.Addr = following.Primary, following.Control
		r := *rec
		r.Claim = &c
		rec = &r
	}
	node := rec.Claim.Node
	if node == "" {
		node = "the primary"
	}
	if err := (claimer{timeout: giveBackTimeout}).Claim(ctx, volmount.ClaimRelease, rec); err != nil {
		grace := "a minute"
		if rec.Claim.Grace > 0 {
			grace = rec.Claim.Grace.String()
		}
		return fmt.Sprintf("its claim on %s was not given back (%v): it lapses by itself %s after the mount's connections closed", node, err, grace)
	}
	return "its claim on " + node + " given back"
}
