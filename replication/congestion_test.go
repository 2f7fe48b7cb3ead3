package replication

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// congestionStep is one observation of a scripted situation and what it
// must give: at offset At from the start, with the fill Queued (percent of
// the send buffer) and the catch-up's Running and Left.
type congestionStep struct {
	At      time.Duration
	Queued  int64 // percent of the send buffer
	Running bool
	Left    int64
	State   ReplState
	Actions CongestionActions
}

func TestCongestionSituations(t *testing.T) {
	const ms = time.Millisecond
	const sustain = 100 * ms
	pullAhead := CongestionConfig{Policy: CongestionPullAhead, SendBuffer: 100, Sustain: sustain}
	// sustained is steps that begin Ahead at 0, after a full buffer for
	// the sustain: the steps move on by it.
	sustained := func(steps ...congestionStep) []congestionStep {
		out := []congestionStep{{At: 0, Queued: 100, State: Connected, Actions: WaitForRoom}}
		for _, s := range steps {
			s.At += sustain
			out = append(out, s)
		}
		return out
	}
	cases := []struct {
		name  string
		cfg   CongestionConfig
		steps []congestionStep
	}{
		{"a full buffer for the sustain goes Ahead", pullAhead, []congestionStep{
			{At: 0, Queued: 50, State: Connected},
			{At: 10 * ms, Queued: 100, State: Connected, Actions: WaitForRoom},
			{At: 10*ms + sustain, Queued: 100, State: Ahead, Actions: StartMarking},
		}},
		{"pull-ahead goes Ahead at high water held for the sustain, before the buffer is full", pullAhead, []congestionStep{
			{At: 0, Queued: 89, State: Connected},
			{At: 1 * ms, Queued: 90, State: Connected},
			{At: 1*ms + sustain, Queued: 90, State: Ahead, Actions: StartMarking},
		}},
		{"a burst shorter than the sustain stays Connected: writes are shipped, then wait for room", pullAhead, []congestionStep{
			{At: 0, Queued: 50, State: Connected},
			{At: 10 * ms, Queued: 95, State: Connected},
			{At: 20 * ms, Queued: 100, State: Connected, Actions: WaitForRoom},
			{At: 50 * ms, Queued: 120, State: Connected, Actions: WaitForRoom},
			{At: 10*ms + sustain - 1*ms, Queued: 100, State: Connected, Actions: WaitForRoom},
			{At: 10*ms + sustain, Queued: 20, State: Connected}, // the link carried it
			// As long below as it was above: the clock is back at zero, and
			// a new burst needs the whole sustain.
			{At: 10*ms + 2*sustain, Queued: 95, State: Connected},
			{At: 10*ms + 3*sustain - 1*ms, Queued: 100, State: Connected, Actions: WaitForRoom},
			{At: 10*ms + 3*sustain, Queued: 100, State: Ahead, Actions: StartMarking},
		}},
		{"a link that cannot carry the rate goes Ahead though acks drain the fill for moments", pullAhead, []congestionStep{
			{At: 0, Queued: 100, State: Connected, Actions: WaitForRoom},
			{At: 30 * ms, Queued: 10, State: Connected},
			{At: 31 * ms, Queued: 100, State: Connected, Actions: WaitForRoom},
			{At: 60 * ms, Queued: 30, State: Connected},
			{At: 61 * ms, Queued: 100, State: Connected, Actions: WaitForRoom},
			// 102 ms above high water, 2 below.
			{At: sustain + 3*ms, Queued: 100, State: Connected, Actions: WaitForRoom},
			{At: sustain + 4*ms, Queued: 95, State: Ahead, Actions: StartMarking},
		}},
		{"block waits for room and never goes Ahead", CongestionConfig{Policy: CongestionBlock, SendBuffer: 100}, []congestionStep{
			{At: 0, Queued: 95, State: Connected},
			{At: 1 * ms, Queued: 100, State: Connected, Actions: WaitForRoom},
			{At: 5 * time.Second, Queued: 120, State: Connected, Actions: WaitForRoom},
			{At: 6 * time.Second, Queued: 99, State: Connected},
		}},
		{"disconnect drops the connection", CongestionConfig{Policy: CongestionDisconnect, SendBuffer: 100}, []congestionStep{
			{At: 0, Queued: 80, State: Connected},
			{At: 1 * ms, Queued: 90, State: Connecting, Actions: Disconnect},
			{At: 2 * ms, Queued: 100, State: Connecting},
		}},
		{"a brief dip below low water does not end Ahead", pullAhead, sustained(
			congestionStep{At: 0, Queued: 100, State: Ahead, Actions: StartMarking},
			congestionStep{At: 3 * time.Second, Queued: 10, Left: 40, State: Ahead},
			congestionStep{At: 3*time.Second + 900*ms, Queued: 30, Left: 40, State: Ahead},
			congestionStep{At: 4*time.Second + 100*ms, Queued: 10, Left: 40, State: Ahead},
			congestionStep{At: 5 * time.Second, Queued: 10, Left: 40, State: Ahead},
			congestionStep{At: 5*time.Second + 100*ms, Queued: 10, Left: 40, State: SyncSource, Actions: ResumeStreaming | StartCatchUp},
		)},
		{"Ahead ends no sooner than the dwell, however low the fill", pullAhead, sustained(
			congestionStep{At: 0, Queued: 100, State: Ahead, Actions: StartMarking},
			congestionStep{At: 1 * ms, Queued: 0, Left: 40, State: Ahead},
			congestionStep{At: 1*time.Second + 1*ms, Queued: 0, Left: 40, State: Ahead},
			congestionStep{At: 2 * time.Second, Queued: 0, Left: 40, State: SyncSource, Actions: ResumeStreaming | StartCatchUp},
		)},
		{"catch-up done and buffer low returns to streaming", pullAhead, sustained(
			congestionStep{At: 0, Queued: 100, State: Ahead, Actions: StartMarking},
			congestionStep{At: 2 * time.Second, Queued: 0, Left: 40, State: Ahead},
			congestionStep{At: 3 * time.Second, Queued: 0, Left: 40, State: SyncSource, Actions: ResumeStreaming | StartCatchUp},
			congestionStep{At: 4 * time.Second, Queued: 5, Running: true, Left: 10, State: SyncSource},
			congestionStep{At: 4*time.Second + 10*ms, Queued: 5, Running: true, State: SyncSource},
			congestionStep{At: 4*time.Second + 20*ms, Queued: 5, State: Connected},
		)},
		{"Ahead with nothing marked returns straight to streaming", pullAhead, sustained(
			congestionStep{At: 0, Queued: 100, State: Ahead, Actions: StartMarking},
			congestionStep{At: 1 * time.Second, Queued: 0, State: Ahead},
			congestionStep{At: 2 * time.Second, Queued: 0, State: Connected, Actions: ResumeStreaming},
		)},
		{"congestion during the catch-up within the dwell marks the write instead of going Ahead", pullAhead, sustained(
			congestionStep{At: 0, Queued: 100, State: Ahead, Actions: StartMarking},
			congestionStep{At: 1 * time.Second, Queued: 0, Left: 40, State: Ahead},
			congestionStep{At: 2 * time.Second, Queued: 0, Left: 40, State: SyncSource, Actions: ResumeStreaming | StartCatchUp},
			congestionStep{At: 2*time.Second + 50*ms, Queued: 95, Running: true, Left: 30, State: SyncSource},
			congestionStep{At: 2*time.Second + 60*ms, Queued: 100, Running: true, Left: 30, State: SyncSource, Actions: MarkOne},
			congestionStep{At: 4 * time.Second, Queued: 100, Running: true, Left: 20, State: Ahead, Actions: StartMarking | PauseCatchUp},
		)},
		{"congestion during the catch-up after the dwell pauses it and goes Ahead again", pullAhead, sustained(
			congestionStep{At: 0, Queued: 100, State: Ahead, Actions: StartMarking},
			congestionStep{At: 1 * time.Second, Queued: 0, Left: 40, State: Ahead},
			congestionStep{At: 2 * time.Second, Queued: 0, Left: 40, State: SyncSource, Actions: ResumeStreaming | StartCatchUp},
			congestionStep{At: 4 * time.Second, Queued: 90, Running: true, Left: 20, State: Ahead, Actions: StartMarking | PauseCatchUp},
		)},
		{"the catch-up's end is not held back by the dwell", pullAhead, sustained(
			congestionStep{At: 0, Queued: 100, State: Ahead, Actions: StartMarking},
			congestionStep{At: 1 * time.Second, Queued: 0, Left: 4, State: Ahead},
			congestionStep{At: 2 * time.Second, Queued: 0, Left: 4, State: SyncSource, Actions: ResumeStreaming | StartCatchUp},
			congestionStep{At: 2*time.Second + 1*ms, Queued: 0, State: Connected},
		)},
		{"a third entry into Ahead within a minute marks writes without going Ahead when the cap is two",
			CongestionConfig{Policy: CongestionPullAhead, SendBuffer: 100, Sustain: sustain, MaxAheadPerMinute: 2}, sustained(
				congestionStep{At: 0, Queued: 100, State: Ahead, Actions: StartMarking},
				congestionStep{At: 1 * time.Second, Queued: 0, State: Ahead},
				congestionStep{At: 2 * time.Second, Queued: 0, State: Connected, Actions: ResumeStreaming},
				congestionStep{At: 4 * time.Second, Queued: 100, State: Ahead, Actions: StartMarking},
				congestionStep{At: 5 * time.Second, Queued: 0, State: Ahead},
				congestionStep{At: 6 * time.Second, Queued: 0, State: Connected, Actions: ResumeStreaming},
				congestionStep{At: 8 * time.Second, Queued: 100, State: Connected, Actions: MarkOne},
				congestionStep{At: 59 * time.Second, Queued: 100, State: Connected, Actions: MarkOne},
				congestionStep{At: 60 * time.Second, Queued: 100, State: Ahead, Actions: StartMarking},
			)},
		{"blocks marked without going Ahead are caught up once the link has had room", pullAhead, sustained(
			congestionStep{At: 0, Queued: 100, State: Ahead, Actions: StartMarking},
			congestionStep{At: 1 * time.Second, Queued: 0, State: Ahead},
			congestionStep{At: 2 * time.Second, Queued: 0, State: Connected, Actions: ResumeStreaming},
			congestionStep{At: 2*time.Second + 10*ms, Queued: 100, State: Connected, Actions: MarkOne},
			congestionStep{At: 2*time.Second + 20*ms, Queued: 5, Left: 8, State: Connected},
			congestionStep{At: 3*time.Second + 30*ms, Queued: 5, Left: 8, State: SyncSource, Actions: StartCatchUp},
		)},
		{"a minute after the last Ahead, a burst is a burst again", pullAhead, sustained(
			congestionStep{At: 0, Queued: 100, State: Ahead, Actions: StartMarking},
			congestionStep{At: 1 * time.Second, Queued: 0, State: Ahead},
			congestionStep{At: 2 * time.Second, Queued: 0, State: Connected, Actions: ResumeStreaming},
			congestionStep{At: time.Minute, Queued: 100, State: Connected, Actions: WaitForRoom},
			congestionStep{At: time.Minute + sustain, Queued: 100, State: Ahead, Actions: StartMarking},
		)},
		{"a first congestion right after connecting goes Ahead once sustained, without a dwell", pullAhead, []congestionStep{
			{At: 1 * ms, Queued: 95, State: Connected},
			{At: 1*ms + sustain, Queued: 95, State: Ahead, Actions: StartMarking},
		}},
	}
	start := time.Unix(1_000_000, 0)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctl, err := NewCongestion(c.cfg, start)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range c.steps {
				in := CongestionInput{Now: start.Add(s.At), Queued: s.Queued * c.cfg.SendBuffer / 100, CatchUpRunning: s.Running, CatchUpLeft: s.Left}
				state, acts := ctl.Step(in)
				if state != s.State || acts != s.Actions {
					t.Fatalf("step %d at %v (queued %d%%): got %s %s, want %s %s", i, s.At, s.Queued, state, acts, s.State, s.Actions)
				}
				if ctl.State() != state {
					t.Fatalf("step %d: State() %s, Step said %s", i, ctl.State(), state)
				}
			}
		})
	}
}

// TestCongestionDoesNotFlap drives a pull-ahead controller with loads that
// swing the fill across the water marks every few milliseconds for
// simulated minutes, with a catch-up that really runs, and pins that the
// state changes at most once per MinDwell and enters Ahead at most
// MaxAheadPerMinute times in any minute. With the hysteresis turned down
// to nothing the same loads flap, so the loads do swing.
func TestCongestionDoesNotFlap(t *testing.T) {
	const duration = 3 * time.Minute
	square := func(period, highFor time.Duration, high, low int64) func(time.Duration, *rand.Rand) int64 {
		return func(at time.Duration, _ *rand.Rand) int64 {
			if at%period < highFor {
				return high
			}
			return low
		}
	}
	loads := []struct {
		name string
		fill func(at time.Duration, r *rand.Rand) int64 // percent of the send buffer
	}{
		{"around high water every 3 ms", square(6*time.Millisecond, 3*time.Millisecond, 92, 88)},
		{"full and empty every 3 ms", square(6*time.Millisecond, 3*time.Millisecond, 100, 0)},
		{"empty for just over the hold, then full for 50 ms", square(1100*time.Millisecond, 50*time.Millisecond, 100, 0)},
		{"full for 10 ms every 2.5 s", square(2500*time.Millisecond, 10*time.Millisecond, 100, 10)},
		{"random each ms", func(_ time.Duration, r *rand.Rand) int64 { return r.Int64N(101) }},
		{"random bursts", func(at time.Duration, r *rand.Rand) int64 {
			if r.IntN(200) == 0 {
				return 100
			}
			return r.Int64N(25)
		}},
	}
	hysteresis := CongestionConfig{Policy: CongestionPullAhead, SendBuffer: 1 << 20}
	none := CongestionConfig{Policy: CongestionPullAhead, SendBuffer: 1 << 20, Hold: time.Nanosecond, MinDwell: time.Nanosecond, Sustain: time.Nanosecond, MaxAheadPerMinute: 1 << 20}
	for _, load := range loads {
		t.Run(load.name, func(t *testing.T) {
			got := simulateCongestion(t, hysteresis, duration, load.fill)
			cfg := hysteresis.WithDefaults()
			limit := int(duration/cfg.MinDwell) + 1
			t.Logf("%d state changes (%d into Ahead) in %v; at most %d allowed", len(got.changes), got.aheads, duration, limit)
			if len(got.changes) > limit {
				t.Fatalf("%d state changes in %v, more than one per dwell (%d): %s", len(got.changes), duration, limit, got)
			}
			for i := 1; i < len(got.changes); i++ {
				if gap := got.changes[i].at - got.changes[i-1].at; gap < cfg.MinDwell && got.changes[i].to != Connected {
					t.Fatalf("change %d came %v after the previous one: %s", i, gap, got)
				}
			}
			for i, c := range got.changes {
				n := 0
				for _, d := range got.changes[i:] {
					if d.at-c.at < time.Minute && d.to == Ahead {
						n++
					}
				}
				if n > cfg.MaxAheadPerMinute {
					t.Fatalf("%d entries into Ahead in the minute from %v: %s", n, c.at, got)
				}
			}
		})
	}
	// The loads that swing across both water marks flap without the
	// hysteresis: the test above would see it.
	for _, i := range []int{1, 2, 4} {
		got := simulateCongestion(t, none, duration, loads[i].fill)
		t.Logf("without hysteresis, %q: %d state changes", loads[i].name, len(got.changes))
		if len(got.changes) < 100 {
			t.Fatalf("without hysteresis %q made only %d state changes: the load does not swing", loads[i].name, len(got.changes))
		}
	}
}

type stateChange struct {
	at time.Duration
	to ReplState
}

type congestionRun struct {
	changes []stateChange
	aheads  int
}

func (r congestionRun) String() string {
	var b strings.Builder
	for _, c := range r.changes {
		fmt.Fprintf(&b, " %v→%s", c.at, c.to)
	}
	return b.String()
}

// simulateCongestion steps a controller every millisecond for duration:
// the fill comes from the load; writes while Ahead mark blocks, the
// catch-up clears them at a fixed rate while it runs.
func simulateCongestion(t *testing.T, cfg CongestionConfig, duration time.Duration, fill func(time.Duration, *rand.Rand) int64) congestionRun {
	t.Helper()
	start := time.Unix(1_000_000, 0)
	ctl, err := NewCongestion(cfg, start)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	var run congestionRun
	var marked int64
	running := false
	state := ctl.State()
	for at := time.Duration(0); at < duration; at += time.Millisecond {
		switch {
		case state == Ahead:
			marked += 64 << 10
		case running:
			marked = max(0, marked-256<<10)
			running = marked > 0
		}
		queued := fill(at, r) * cfg.SendBuffer / 100
		next, acts := ctl.Step(CongestionInput{Now: start.Add(at), Queued: queued, CatchUpRunning: running, CatchUpLeft: marked})
		if acts.Has(StartCatchUp) {
			running = true
		}
		if acts.Has(PauseCatchUp) {
			running = false
		}
		if next != state {
			run.changes = append(run.changes, stateChange{at, next})
			if next == Ahead {
				run.aheads++
			}
			state = next
		}
	}
	return run
}

func TestCongestionConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  CongestionConfig
		want string // a part of the error; "" for none
	}{
		{"the defaults are valid", CongestionConfig{Policy: CongestionPullAhead}, ""},
		{"an unknown policy names the allowed ones", CongestionConfig{Policy: "drop"}, "want block, pull-ahead or disconnect"},
		{"low water above high water", CongestionConfig{Policy: CongestionBlock, LowWaterPercent: 95}, "want 0 < low < high <= 100"},
		{"high water above the buffer", CongestionConfig{Policy: CongestionBlock, HighWaterPercent: 120}, "want 0 < low < high <= 100"},
		{"a negative buffer", CongestionConfig{Policy: CongestionBlock, SendBuffer: -1}, "send_buffer -1"},
		{"a negative hold", CongestionConfig{Policy: CongestionBlock, Hold: -time.Second}, "no negative time"},
		{"a negative sustain", CongestionConfig{Policy: CongestionPullAhead, Sustain: -time.Second}, "no negative time"},
		{"a negative cap", CongestionConfig{Policy: CongestionBlock, MaxAheadPerMinute: -1}, "at least 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewCongestion(c.cfg, time.Unix(0, 0))
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got error %v, want one with %q", err, c.want)
			}
		})
	}
}

func TestOnCongestionPolicy(t *testing.T) {
	for _, s := range []string{"block", "pull-ahead", "disconnect"} {
		if p, err := ParseOnCongestion(s); err != nil || string(p) != s {
			t.Fatalf("ParseOnCongestion(%q) = %q, %v", s, p, err)
		}
	}
	if _, err := ParseOnCongestion(""); err == nil {
		t.Fatal("accepted an empty policy")
	}
	cases := []struct {
		name     string
		protocol string
		policy   OnCongestion
		ok       bool
	}{
		{"pull-ahead under A", "A", CongestionPullAhead, true},
		{"pull-ahead under B would break B's promise", "B", CongestionPullAhead, false},
		{"pull-ahead under C would break C's promise", "C", CongestionPullAhead, false},
		{"block under C", "C", CongestionBlock, true},
		{"disconnect under B", "B", CongestionDisconnect, true},
	}
	for _, c := range cases {
		if err := CheckOnCongestion(c.protocol, c.policy); (err == nil) != c.ok {
			t.Errorf("%s: got %v", c.name, err)
		}
	}
	if DefaultOnCongestion("A") != CongestionPullAhead || DefaultOnCongestion("C") != CongestionBlock {
		t.Fatal("defaults: pull-ahead for A, block otherwise")
	}
	if PeerState(Ahead) != Behind || PeerState(SyncSource) != SyncTarget || PeerState(Connected) != Connected {
		t.Fatal("PeerState")
	}
	if got := (StartMarking | PauseCatchUp).String(); got != "start-marking+pause-catch-up" {
		t.Fatalf("String: %s", got)
	}
}
