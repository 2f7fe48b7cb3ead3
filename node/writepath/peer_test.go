package writepath

import (
	"fmt"
	"slices"
	"testing"
)

// peerWorld is what a scripted peer's part meets: the admissions its
// offers get, in turn, whether the tracking works, and the results its
// marks get, in turn.
type peerWorld struct {
	offers    []Admission
	trackFail bool
	marks     []MarkResult
}

// runPeer drives one peer's part through every step with w's answers and
// returns the steps it ran (a Mark as "mark:how") and its outcome.
func runPeer(t *testing.T, changes bool, w peerWorld) ([]string, PeerOutcome) {
	t.Helper()
	p := BeginPeer(changes)
	var steps []string
	for range 20 {
		s := p.Next()
		switch s {
		case Offer:
			steps = append(steps, "offer")
			a := w.offers[0]
			w.offers = w.offers[1:]
			p.Offered(a)
		case Track:
			steps = append(steps, fmt.Sprintf("track:behind=%t", p.Behind()))
			p.Tracked(!w.trackFail)
		case Mark:
			steps = append(steps, "mark:"+map[MarkHow]string{MarkUnlessStreaming: "unless-streaming", MarkByStream: "by-stream", MarkAlways: "always"}[p.MarkHow()])
			r := MarkDone
			if len(w.marks) > 0 {
				r, w.marks = w.marks[0], w.marks[1:]
			}
			p.Marked(r)
		case Settle:
			steps = append(steps, "settle")
			p.Settled()
		case PeerDone:
			if len(w.offers) > 0 || len(w.marks) > 0 {
				t.Fatalf("done after %v with answers left: %+v", steps, w)
			}
			return steps, p.PeerOutcome()
		}
	}
	t.Fatalf("no PeerDone after %v", steps)
	return nil, 0
}

// TestAPeerThatMissesAWriteIsTrackedThenMarkedBeforeItsPartSettles pins
// the rule of peerOrder: whatever way a peer misses a write (no stream,
// Behind, a stream that started or ended on the way, a tracking that
// failed), its blocks are marked, after the tracking, before its part of
// the Ship stage settles, and nothing runs after the settling (a runner
// would run it after the write could complete). A peer whose stream took
// the entry is neither tracked nor marked.
func TestAPeerThatMissesAWriteIsTrackedThenMarkedBeforeItsPartSettles(t *testing.T) {
	for _, c := range []struct {
		name    string
		changes bool
		w       peerWorld
		steps   []string
		want    PeerOutcome
	}{
		{"the stream takes it", true, peerWorld{offers: []Admission{Streamed}},
			[]string{"offer", "settle"}, InStream},
		{"the stream ended as it was offered, a new one takes it", true, peerWorld{offers: []Admission{StreamEnded, Streamed}},
			[]string{"offer", "offer", "settle"}, InStream},
		{"no stream", true, peerWorld{offers: []Admission{NoStream}},
			[]string{"offer", "track:behind=false", "mark:unless-streaming", "settle"}, Missed},
		{"the stream ended as it was offered, and no stream", true, peerWorld{offers: []Admission{StreamEnded, NoStream}},
			[]string{"offer", "offer", "track:behind=false", "mark:unless-streaming", "settle"}, Missed},
		{"no stream, and the tracking fails", true, peerWorld{offers: []Admission{NoStream}, trackFail: true},
			[]string{"offer", "track:behind=false", "mark:always", "settle"}, MissNotTracked},
		{"no stream, and one started before the mark", true, peerWorld{offers: []Admission{NoStream, Streamed}, marks: []MarkResult{MarkStreaming}},
			[]string{"offer", "track:behind=false", "mark:unless-streaming", "offer", "settle"}, InStream},
		{"no stream, one started before the mark and ended as it was offered", true,
			peerWorld{offers: []Admission{NoStream, StreamEnded, NoStream}, marks: []MarkResult{MarkStreaming}},
			[]string{"offer", "track:behind=false", "mark:unless-streaming", "offer", "offer", "track:behind=false", "mark:unless-streaming", "settle"}, Missed},
		{"Behind", true, peerWorld{offers: []Admission{Behind}},
			[]string{"offer", "track:behind=true", "mark:by-stream", "settle"}, Missed},
		{"Behind, and the stream ended before it marked", true, peerWorld{offers: []Admission{Behind}, marks: []MarkResult{MarkEnded}},
			[]string{"offer", "track:behind=true", "mark:by-stream", "mark:always", "settle"}, Missed},
		{"Behind, and the tracking fails", true, peerWorld{offers: []Admission{Behind}, trackFail: true},
			[]string{"offer", "track:behind=true", "mark:by-stream", "settle"}, MissNotTracked},
		{"a flush the stream takes", false, peerWorld{offers: []Admission{Streamed}},
			[]string{"offer", "settle"}, InStream},
		{"a flush with no stream", false, peerWorld{offers: []Admission{StreamEnded, NoStream}},
			[]string{"offer", "offer", "settle"}, FlushNotStreamed},
	} {
		steps, o := runPeer(t, c.changes, c.w)
		if !slices.Equal(steps, c.steps) || o != c.want {
			t.Errorf("%s: steps %v, outcome %s; want %v, %s", c.name, steps, o, c.steps, c.want)
		}
		if settle := slices.Index(steps, "settle"); settle != len(steps)-1 {
			t.Errorf("%s: steps %v: a step runs after the part settled (the write may have completed)", c.name, steps)
		}
	}
}

func TestAPeerStepReportedOutOfOrderPanics(t *testing.T) {
	for _, c := range []struct {
		name string
		bad  func(p *Peer)
	}{
		{"a mark before the offer", func(p *Peer) { p.Marked(MarkDone) }},
		{"a mark of a peer the stream took", func(p *Peer) { p.Offered(Streamed); p.Marked(MarkDone) }},
		{"a settle before the tracking", func(p *Peer) { p.Offered(NoStream); p.Settled() }},
		{"a stream that ended at a mark unless streaming", func(p *Peer) { p.Offered(NoStream); p.Tracked(true); p.Marked(MarkEnded) }},
		{"a flush Behind", func(p *Peer) { p.Offered(Behind) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", c.name)
				}
			}()
			p := BeginPeer(!slices.Contains([]string{"a flush Behind"}, c.name))
			c.bad(&p)
		}()
	}
}
