package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/replvol/replvol/internal/volmount"
	"github.com/replvol/replvol/transport"
	"github.com/replvol/replvol/transport/nbdclient"
	"google.golang.org/grpc/status"
)

// primaryFinder finds a volume's primary through the cluster's control addresses, for
// replctl mount --follow and its helper: it asks them in turn who is primary, and takes the
// primary's word only from the primary itself (its own status says it is primary and serves
// the export). It never names a node that does not say so.
type primaryFinder struct {
	volume string
	// addrs are the control addresses to ask, the last primary's first; the nodes' status
	// adds the cluster's others.
	addrs []string
	// tlsDir is the operator's certificate for the control API ("": none).
	tlsDir string
	// claim, when set, is taken at each primary found (same ID, host and dir) BEFORE the
	// helper connects, and confirmed once it is connected.
	claim *volmount.Claim
	dir   string
	// perCall bounds each control call.
	perCall time.Duration
	logf    func(format string, args ...any)
}

// ask is the cluster status of the node at addr.
func (p *primaryFinder) ask(ctx context.Context, addr string) (*transport.ClusterStatus, error) {
	c, err := (&globals{tlsDir: p.tlsDir}).dialControl(addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, p.perCall)
	defer cancel()
	return c.ClusterStatus(ctx, &transport.StatusRequest{})
}

// learn adds the control addresses of st's nodes to those to ask.
func (p *primaryFinder) learn(st *transport.ClusterStatus) {
	for _, n := range st.Nodes {
		if n.Control != "" && !slices.Contains(p.addrs, n.Control) {
			p.addrs = append(p.addrs, n.Control)
		}
	}
}

// first puts addr first among those to ask.
func (p *primaryFinder) first(addr string) {
	p.addrs = append([]string{addr}, slices.DeleteFunc(p.addrs, func(a string) bool { return a == addr })...)
}

// find asks the control addresses in turn, the primary one names first, until the primary
// itself says it serves the volume; an error says what each said.
func (p *primaryFinder) find(ctx context.Context) (volmount.Primary, error) {
	tried := map[string]bool{}
	var why []string
	queue := slices.Clone(p.addrs)
	for len(queue) > 0 && ctx.Err() == nil {
		addr := queue[0]
		queue = queue[1:]
		if tried[addr] {
			continue
		}
		tried[addr] = true
		st, err := p.ask(ctx, addr)
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %s", addr, plainMessage(status.Convert(err).Message())))
			continue
		}
		p.learn(st)
		for _, a := range p.addrs {
			if !tried[a] && !slices.Contains(queue, a) {
				queue = append(queue, a)
			}
		}
		uri, waitFor, err := mountTarget(st, p.volume)
		var np *notPrimaryError
		switch {
		case err == nil && waitFor == "":
			p.first(addr)
			return volmount.Primary{Name: st.From, Control: addr, URI: uri}, nil
		case err == nil:
			why = append(why, waitFor)
		case errors.As(err, &np):
			if np.PrimaryAddr != "" && !tried[np.PrimaryAddr] {
				queue = append([]string{np.PrimaryAddr}, queue...)
			}
			why = append(why, fmt.Sprintf("%s: primary %q", st.From, np.Primary))
		default:
			return volmount.Primary{}, stopFollowing{err}
		}
	}
	if err := ctx.Err(); err != nil {
		why = append(why, err.Error())
	}
	return volmount.Primary{}, fmt.Errorf("no primary of %s serves now (%s)", p.volume, strings.Join(why, "; "))
}

// locate finds the primary and takes the mount's claim there: the helper's FindPrimary. A
// take the primary refuses because another mount holds the volume ends the following.
func (p *primaryFinder) locate(ctx context.Context) (volmount.Primary, error) {
	pr, err := p.find(ctx)
	if err != nil || p.claim == nil {
		return pr, err
	}
	rec := &volmount.Record{Volume: p.volume, Dir: p.dir, Follow: true, Claim: &volmount.Claim{
		ID: p.claim.ID, Host: p.claim.Host, Node: pr.Name, Addr: pr.Control, TLSDir: p.tlsDir, Grace: p.claim.Grace}}
	cl := claimer{timeout: p.perCall}
	if err := cl.Claim(ctx, volmount.ClaimTake, rec); err != nil {
		if p.heldByAnother(ctx, pr.Control) {
			return volmount.Primary{}, stopFollowing{err}
		}
		return volmount.Primary{}, err
	}
	pr.Confirm = func(ctx context.Context) error {
		err := cl.Claim(ctx, volmount.ClaimConfirm, rec)
		if err != nil && p.heldByAnother(ctx, pr.Control) {
			return stopFollowing{err}
		}
		return err
	}
	return pr, nil
}

// heldByAnother says whether the node at addr is the volume's primary and another mount
// holds its claim there (a refused take is then that mount's, not a primary that changed).
func (p *primaryFinder) heldByAnother(ctx context.Context, addr string) bool {
	c, err := (&globals{tlsDir: p.tlsDir}).dialControl(addr)
	if err != nil {
		return false
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, p.perCall)
	defer cancel()
	ns, err := c.NodeStatus(ctx, &transport.StatusRequest{})
	if err != nil {
		return false
	}
	for _, v := range ns.Volumes {
		if v.Name == p.volume && v.Mount != nil && v.Mount.Holder.ID != p.claim.ID {
			return true
		}
	}
	return false
}

// findPrimaryFor is the helper's PrimaryFinder: from the record's control addresses and
// claim, as replctl mount --follow passed them.
func findPrimaryFor(cfg volmount.HelperConfig, logf func(format string, args ...any)) (volmount.FindPrimary, error) {
	p := &primaryFinder{volume: cfg.Volume, addrs: slices.Clone(cfg.Controls), tlsDir: cfg.TLSDir, dir: cfg.ClaimDir,
		perCall: 10 * time.Second, logf: logf}
	if cfg.ClaimID != "" {
		p.claim = &volmount.Claim{ID: cfg.ClaimID, Host: cfg.ClaimHost, Grace: cfg.IOTimeout}
	}
	return p.locate, nil
}

var _ volmount.PrimaryFinder = findPrimaryFor

// stopFollowing is an error that ends the following (nbdclient.ErrStopFollowing): it says
// err's words only.
type stopFollowing struct{ err error }

func (e stopFollowing) Error() string   { return e.err.Error() }
func (e stopFollowing) Unwrap() []error { return []error{nbdclient.ErrStopFollowing, e.err} }

// primaryToFollow finds volume's primary from the node at --addr, waiting through an
// election until --timeout, for replctl mount --follow and replctl attach --follow: the
// primary, and the finder that knows the cluster's control addresses.
func (g *globals) primaryToFollow(ctx context.Context, volume, tlsDir string) (volmount.Primary, *primaryFinder, error) {
	p := &primaryFinder{volume: volume, addrs: []string{g.addr}, tlsDir: tlsDir, perCall: g.timeout}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	for {
		pr, err := p.find(ctx)
		if err == nil {
			return pr, p, g.checkNBDCertificate(pr.URI)
		}
		var stop stopFollowing
		if errors.As(err, &stop) {
			return pr, nil, stop.err
		}
		select {
		case <-ctx.Done():
			return pr, nil, unreachableError(fmt.Errorf("%w; waited %s (--timeout)", err, g.timeout))
		case <-time.After(200 * time.Millisecond):
		}
	}
}
