package main

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
	"github.com/replvol/replvol/transport"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func newEvents(g *globals) *cobra.Command {
	var (
		asJSON   bool
		all      bool
		since    string
		nodeName string
	)
	cmd := &cobra.Command{
		Use:   "events [--json] [--since DURATION|TIME] [--node NAME | --all]",
		Short: "Follow the cluster's state changes live (like drbdsetup events2)",
		Long: `Print each event of a node as it happens: role changes, connects and
disconnects, resync and verify start and end, path failures, split brains,
raft leader changes, quorum and lease lost or regained, with time, node,
volume, kind, the peer and the state before and after, and why.
Without --since the node's current state comes first, as drbdsetup events2
shows it: a line of kind exists for the node, each volume (its role) and each
peer (its replication state), then one of kind exists-end; then what happens.
--since 10m (or a time: 15:04, "2006-01-02 15:04:05", RFC 3339) instead first
shows the events since then (a node keeps its last 1000). --json prints one
JSON object per line with the keys time, node, seq, volume, kind, peer, old,
new, reason, message, offset and length (empty strings, or 0, when an event
has none; offset and length are the byte range of block-repaired,
block-unrecoverable and bad-block; seq is 0 for the state lines, which are not recorded).

By default the node at --addr is followed; --node follows another node of its
cluster, --all every node, merged in time order. A node that goes away is
reported on stderr; with --all the others are followed on and the lost node is
retried every 2 s (what it recorded meanwhile is shown when it is back).
Ctrl-C ends the stream (exit 0).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if all && nodeName != "" {
				return usageErrorf("give --node NAME or --all, not both")
			}
			req := transport.EventsRequest{State: since == ""}
			if since != "" {
				t, err := parseSince(since, time.Now())
				if err != nil {
					return asUsage(err)
				}
				req.Since, req.History = t, historyKept
			}
			pal, err := g.paletteFor(cmd.OutOrStdout())
			if err != nil {
				return asUsage(err)
			}
			sources, err := eventSources(cmd, g, nodeName, all)
			if err != nil {
				return err
			}
			f := &eventFollower{out: cmd.OutOrStdout(), errOut: cmd.ErrOrStderr(), asJSON: asJSON, pal: pal, retry: all, g: g}
			return f.run(cmd.Context(), sources, req)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per line")
	cmd.Flags().StringVar(&since, "since", "", "first show the events since this long ago (10m) or this time (15:04, 2006-01-02 15:04:05, RFC 3339)")
	cmd.Flags().StringVar(&nodeName, "node", "", "follow this node (default: the node at --addr)")
	cmd.Flags().BoolVar(&all, "all", false, "follow every node of the cluster, merged by time")
	return cmd
}

// historyKept is how many events a node keeps (metadata's maxEvents):
// --since asks for all of them and the node sends those since then.
const historyKept = 1000

// parseSince reads --since: a duration back from now, or a time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--since %s: give a positive duration (how long ago)", s)
		}
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, time.RFC3339, "2006-01-02 15:04:05", "2006-01-02 15:04", "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			return t, nil
		}
	}
	for _, layout := range []string{"15:04:05", "15:04"} {
		if t, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			y, m, d := now.Date()
			t = time.Date(y, m, d, t.Hour(), t.Minute(), t.Second(), 0, time.Local)
			if t.After(now) {
				t = t.AddDate(0, 0, -1) // 23:50 at 00:10 means yesterday's
			}
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("--since %q: want a duration (10m, 2h) or a time (15:04, \"2006-01-02 15:04:05\", RFC 3339)", s)
}

// eventSource is one node to follow.
type eventSource struct {
	name string // "" until known
	addr string
}

func (s eventSource) String() string {
	if s.name == "" {
		return nodeAt(s.addr)
	}
	return fmt.Sprintf("node %s at %s", s.name, s.addr)
}

// eventSources resolves --node and --all through the cluster status of
// the node at --addr.
func eventSources(cmd *cobra.Command, g *globals, nodeName string, all bool) ([]eventSource, error) {
	if nodeName == "" && !all {
		return []eventSource{{name: knownNode(g.addr), addr: g.addr}}, nil
	}
	k, err := g.dial(cmd, "")
	if err != nil {
		return nil, err
	}
	defer k.close()
	st, err := k.status()
	if err != nil {
		return nil, k.fail(err, "", "")
	}
	if err := checkNames(st, "", nodeName); err != nil {
		return nil, err
	}
	var sources []eventSource
	for _, n := range st.Nodes {
		if !all && n.Name != nodeName {
			continue
		}
		addr := dialable(n.Control, g.addr)
		if n.Name == st.From {
			addr = g.addr
		}
		sources = append(sources, eventSource{name: n.Name, addr: addr})
	}
	return sources, nil
}

// dialable turns a listen address with no host (":7800", "0.0.0.0:7800")
// into one on the host of via.
func dialable(listen, via string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return listen
	}
	viaHost, _, err := net.SplitHostPort(via)
	if err != nil {
		return listen
	}
	return net.JoinHostPort(viaHost, port)
}

// eventFollower streams events from its sources to out.
type eventFollower struct {
	out, errOut io.Writer
	asJSON      bool
	pal         palette
	// retry: a node that goes away is retried (--all), instead of ending
	// the command.
	retry bool
	// g dials the nodes (with --tls-dir's certificate); nil: plaintext.
	g *globals

	mu lockorder.Mutex // serialises writes to out and errOut
	// arrivals counts the events run received (run's goroutine only).
	arrivals uint64
}

// mergeWindow is how long an event waits for an earlier one from another
// node before it is printed, when several nodes are followed.
const mergeWindow = 300 * time.Millisecond

func (f *eventFollower) run(ctx context.Context, sources []eventSource, req transport.EventsRequest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan *transport.Event, 256)
	errs := make(chan error, len(sources))
	for _, src := range sources {
		go func() { errs <- f.follow(ctx, src, req, events) }()
	}
	window := time.Duration(0)
	if len(sources) > 1 {
		window = mergeWindow
		f.note("following %d nodes (%s); Ctrl-C to stop", len(sources), sourceNames(sources))
	}
	var pending eventHeap
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	running := len(sources)
	var firstErr error
	for {
		// Print, in time order, what has waited out the window.
		now := time.Now()
		for len(pending) > 0 && !pending[0].arrived.Add(window).After(now) {
			f.print(heap.Pop(&pending).(pendingEvent).e)
		}
		if len(pending) > 0 {
			timer.Reset(pending[0].arrived.Add(window).Sub(now))
		}
		select {
		case e := <-events:
			heap.Push(&pending, f.pending(e))
		case <-timer.C:
		case err := <-errs:
			running--
			if err != nil && firstErr == nil {
				firstErr = err
			}
			if running == 0 {
				f.drain(events, &pending)
				return firstErr
			}
		case <-ctx.Done():
			f.drain(events, &pending)
			return nil
		}
	}
}

// drain prints what is left, in time order.
func (f *eventFollower) drain(events chan *transport.Event, pending *eventHeap) {
	for {
		select {
		case e := <-events:
			heap.Push(pending, f.pending(e))
			continue
		default:
		}
		break
	}
	for pending.Len() > 0 {
		f.print(heap.Pop(pending).(pendingEvent).e)
	}
}

// follow streams one node's events into events until ctx ends. A node
// that goes away ends it with an error, or, with retry, is tried again
// every 2 s; once back, what it recorded meanwhile is sent first.
func (f *eventFollower) follow(ctx context.Context, src eventSource, req transport.EventsRequest, events chan<- *transport.Event) error {
	var (
		lastSeq uint64
		// lastTime is the time of the last event shown, or from when on
		// events are wanted.
		lastTime = req.Since
		wasUp    bool
		reported bool // the current outage was reported
	)
	if lastTime.IsZero() {
		lastTime = time.Now()
	}
	for {
		err := f.stream(ctx, &src, req, func(e *transport.Event) error {
			if e.Seq != 0 && e.Seq <= lastSeq && !e.Time.After(lastTime) {
				return nil // already shown before the node went away
			}
			if lastSeq != 0 && e.Seq > lastSeq+1 {
				f.note("%d events of %s were missed (the stream fell behind)", e.Seq-lastSeq-1, src)
			}
			if e.Seq != 0 {
				lastSeq = e.Seq
			}
			lastTime = e.Time
			select {
			case events <- e:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}, func() {
			if reported {
				f.note("%s is back", src)
			}
			wasUp, reported = true, false
		})
		if ctx.Err() != nil {
			return nil
		}
		var msg string
		switch {
		case status.Code(err) == codes.Unimplemented:
			return fmt.Errorf("%s does not stream events: is it an older replnode?", src)
		case !wasUp:
			msg = unreachable(src.addr, orUnknown(probe(src.addr), err)).Error()
			if !f.retry {
				return unreachableError(errors.New(msg))
			}
		default:
			msg = fmt.Sprintf("%s went away: %s", src, goneWords(src.addr, err))
			if !f.retry {
				return unreachableError(errors.New(msg + "; no more events"))
			}
		}
		if !reported {
			f.note("%s; following the other nodes, retrying it every 2s", msg)
			reported = true
		}
		wasUp = false
		// What happened meanwhile comes first when it is back.
		req = transport.EventsRequest{History: historyKept, Since: lastTime}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Second):
		}
	}
}

// stream runs one Events call. up is called once the node answered.
func (f *eventFollower) stream(ctx context.Context, src *eventSource, req transport.EventsRequest, fn func(*transport.Event) error, up func()) error {
	g := f.g
	if g == nil {
		g = &globals{}
	}
	c, err := g.dialControl(src.addr)
	if err != nil {
		return err
	}
	defer c.Close()
	// A status call first: it fails at once when the node is down (the
	// stream itself says nothing until the first event), and names it.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	ns, err := c.NodeStatus(sctx, &transport.StatusRequest{})
	cancel()
	if err != nil {
		return err
	}
	src.name = ns.Node.Name
	up()
	if !f.retry {
		f.note("following %s; Ctrl-C to stop", src)
	}
	return c.Events(ctx, &req, fn)
}

func orUnknown(probeErr, err error) error {
	if probeErr != nil {
		return probeErr
	}
	return errors.New(plainMessage(status.Convert(err).Message()))
}

// goneWords says why a stream ended.
func goneWords(addr string, err error) string {
	if why := probe(addr); why != nil {
		return "its replnode stopped or the host is unreachable (" + transport.DialWords(why) + ")"
	}
	if errors.Is(err, io.EOF) {
		return "it ended the stream"
	}
	return "the connection broke (" + plainMessage(status.Convert(err).Message()) + ")"
}

func sourceNames(sources []eventSource) string {
	var names []string
	for _, s := range sources {
		names = append(names, s.name)
	}
	return strings.Join(names, ", ")
}

// note writes a line about the stream itself to stderr.
func (f *eventFollower) note(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fmt.Fprintf(f.errOut, "replctl events: "+format+"\n", args...)
}

// eventJSON is one line of --json: every key always present.
type eventJSON struct {
	Time    time.Time `json:"time"`
	Node    string    `json:"node"`
	Seq     uint64    `json:"seq"`
	Volume  string    `json:"volume"`
	Kind    string    `json:"kind"`
	Peer    string    `json:"peer"`
	Old     string    `json:"old"`
	New     string    `json:"new"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	// Offset and Length are the byte range an event of blocks names
	// (block-repaired, block-unrecoverable); 0 for the others.
	Offset int64 `json:"offset"`
	Length int64 `json:"length"`
}

func (f *eventFollower) print(e *transport.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.asJSON {
		b, err := json.Marshal(eventJSON{Time: e.Time, Node: e.Node, Seq: e.Seq, Volume: e.Volume, Kind: e.Kind,
			Peer: e.Peer, Old: e.Old, New: e.New, Reason: e.Reason, Message: e.Message, Offset: e.Offset, Length: e.Length})
		if err == nil {
			f.out.Write(append(b, '\n'))
		}
		return
	}
	fmt.Fprintln(f.out, formatEvent(e, f.pal))
}

// formatEvent is an event as one line of text.
func formatEvent(e *transport.Event, pal palette) string {
	volume := e.Volume
	if volume == "" {
		volume = "-"
	}
	var detail []string
	if e.Peer != "" {
		detail = append(detail, "peer "+e.Peer+":")
	}
	switch {
	case e.Kind == transport.EventExists && e.New != "":
		detail = append(detail, e.New+":") // a state, not a change
	case e.Old != "" && e.New != "" && e.Old != e.New:
		detail = append(detail, e.Old+" -> "+e.New+":")
	case e.Old == "" && e.New != "":
		detail = append(detail, "-> "+e.New+":") // the first state seen
	case e.New != "":
		detail = append(detail, e.New+":") // unchanged
	case e.Old != "":
		detail = append(detail, "was "+e.Old+":")
	}
	detail = append(detail, e.Message)
	if e.Reason != "" {
		detail = append(detail, "("+e.Reason+")")
	}
	return fmt.Sprintf("%s  %-8s %-8s %s  %s", e.Time.Local().Format("2006-01-02 15:04:05.000"), e.Node, volume,
		pal.paint(eventColor(e.Kind), fmt.Sprintf("%-14s", e.Kind)), strings.Join(detail, " "))
}

// eventColor: red for what needs the operator, yellow for degradation,
// green for recovery.
func eventColor(kind string) string {
	switch kind {
	case "split-brain", "refused", "unrelated-data", "fenced", "detached", "hook-failed", "apply-failed",
		"state-write-failed", "verify-stopped", "promotion-refused", "resync-failed", "path-fail", "peer-lost",
		"quorum-lost", "lease-lost", "remove-refused", "reload-failed", "block-unrecoverable", "scrub-stopped":
		return colorRed
	case "disconnected", "waiting-for-peer", "resync", "verify", "stale-disk", "crashed-primary", "attaching",
		"new-generation", "failover", "forced-primary", "discard-my-data", "stopped", "volume-removed", "block-repaired", "scrub",
		"bad-block":
		return colorYellow
	case "connected", "resync-done", "verify-done", "attached", "pull-done", "split-brain-resolved", "path-restore",
		"serving", "started", "quorum-regained", "lease-regained", "volume-added", "reloaded", "scrub-finished":
		return colorGreen
	case "raft-leader":
		return colorCyan
	case transport.EventExistsEnd:
		return colorDim
	}
	return colorNone
}

// pendingEvent waits in the merge window.
type pendingEvent struct {
	e       *transport.Event
	arrived time.Time
	// n numbers the events as they arrive: equal times (a node's state
	// lines share one) keep the order the node sent them in.
	n uint64
}

// pending is e as it arrives.
func (f *eventFollower) pending(e *transport.Event) pendingEvent {
	f.arrivals++
	return pendingEvent{e: e, arrived: time.Now(), n: f.arrivals}
}

// eventHeap orders pending events by their time (then node and seq).
type eventHeap []pendingEvent

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	a, b := h[i].e, h[j].e
	if !a.Time.Equal(b.Time) {
		return a.Time.Before(b.Time)
	}
	if a.Node != b.Node {
		return a.Node < b.Node
	}
	if a.Seq != b.Seq {
		return a.Seq < b.Seq
	}
	return h[i].n < h[j].n
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(pendingEvent)) }
func (h *eventHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
