package multipath

import (
	"testing"
	"time"
)

// Paths for the selector tables: h is Healthy, s Standby, f Failed, in
// group 0 unless given.
func h() PathView { return PathView{Health: Healthy} }
func s() PathView { return PathView{Health: Standby} }
func f() PathView { return PathView{Health: Failed} }

func (v PathView) g(group int) PathView       { v.Group = group; return v }
func (v PathView) q(inFlight int) PathView    { v.InFlight = inFlight; return v }
func (v PathView) b(bytes int64) PathView     { v.InFlightBytes = bytes; return v }
func (v PathView) tput(rate float64) PathView { v.Throughput = rate; return v }
func views(vs ...PathView) []PathView         { return vs }
func rr(last, ios int) Choice {
	return Choice{Policy: RoundRobin, Last: last, IOsOnLast: ios, RRMinIO: 100}
}
func choice(p Policy, preferred int) Choice { return Choice{Policy: p, Preferred: preferred} }
func (c Choice) last(i int) Choice          { c.Last = i; return c }
func (c Choice) dir(d Direction) Choice     { c.Direction = d; return c }
func (c Choice) size(n int64) Choice        { c.Size = n; return c }

func TestChoose(t *testing.T) {
	const MB = 1 << 20
	tests := []struct {
		name  string
		paths []PathView
		c     Choice
		want  int
	}{
		{"failover uses the preferred path", views(h(), h()), choice(Failover, 1), 1},
		{"failover moves to the next path when the preferred one failed", views(h(), f(), h()), choice(Failover, 1), 2},
		{"failover stays in the preferred path's group", views(h().g(0), f().g(1), h().g(0), h().g(1)), choice(Failover, 1), 3},
		{"failover leaves the group when it has no healthy path", views(h().g(0), f().g(1), f().g(1)), choice(Failover, 1), 0},
		{"failover takes a standby path when none is healthy", views(f(), s(), f()), choice(Failover, 0), 1},
		{"failover prefers a healthy path to a standby one", views(f(), s(), h()), choice(Failover, 0), 2},
		{"no path when every path failed", views(f(), f()), choice(Failover, 0), -1},
		{"no path when there are no paths", nil, choice(QueueLength, 0), -1},

		{"round-robin stays on a path for rr_min_io IOs", views(h(), h()), rr(0, 99), 0},
		{"round-robin switches after rr_min_io IOs", views(h(), h()), rr(0, 100), 1},
		{"round-robin wraps around", views(h(), h(), h()), rr(2, 100), 0},
		{"round-robin skips a failed path", views(h(), f(), h()), rr(0, 100), 2},
		{"round-robin leaves a path that failed at once", views(f(), h()), rr(0, 3), 1},
		{"round-robin keeps the only path", views(h(), f()), rr(0, 100), 0},
		{"round-robin stays in the active group", views(h().g(0), h().g(1), h().g(0)), rr(0, 100), 2},
		{"round-robin spreads over every group when the active group has no path",
			views(f().g(0), h().g(1), h().g(1)), rr(1, 100), 2},

		{"queue-length takes the fewest in flight", views(h().q(3), h().q(1), h().q(2)), choice(QueueLength, 0), 1},
		{"queue-length breaks a tie on the path after the last one", views(h().q(1), h().q(1), h().q(1)), choice(QueueLength, 0).last(0), 1},
		{"queue-length tie after the last path wraps", views(h().q(1), h().q(1), h().q(1)), choice(QueueLength, 0).last(2), 0},
		{"queue-length ignores an idle standby path while a healthy one works", views(h().q(9), s()), choice(QueueLength, 0), 0},
		{"queue-length ignores an idle path of another group", views(h().g(0).q(9), h().g(1)), choice(QueueLength, 0), 0},

		{"service-time weighs bytes in flight by throughput",
			views(h().b(100*MB).tput(200*MB), h().b(60*MB).tput(100*MB)), choice(ServiceTime, 0), 0},
		{"service-time sends a slow path less",
			views(h().b(1*MB).tput(25*MB), h().b(3*MB).tput(100*MB)), choice(ServiceTime, 0).size(MB), 1},
		{"service-time counts this IO's size",
			views(h().tput(1*MB), h().b(1*MB).tput(100*MB)), choice(ServiceTime, 0).size(MB), 1},
		{"service-time compares bytes alone until every throughput is measured",
			views(h().b(10), h().b(5).tput(1e9)), choice(ServiceTime, 0), 1},
		{"service-time breaks a tie on the path after the last one",
			views(h().tput(1), h().tput(1)), choice(ServiceTime, 0).last(1), 0},

		{"active-read balances reads", views(h().q(4), h().q(0)), choice(ActiveRead, 0).dir(Read), 1},
		{"active-read writes on the preferred path", views(h().q(4), h().q(0)), choice(ActiveRead, 0).dir(Write), 0},
		{"active-read writes move when the preferred path failed", views(f(), h()), choice(ActiveRead, 0).dir(Write), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.c
			if c.Policy == RoundRobin && c.RRMinIO == 0 {
				c.RRMinIO = 100
			}
			if got := Choose(tt.paths, &c); got != tt.want {
				t.Errorf("Choose = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestNextPreferred(t *testing.T) {
	tests := []struct {
		name      string
		paths     []PathView
		preferred int
		want      int
	}{
		{"a healthy preferred path stays", views(h(), h()), 0, 0},
		{"the next healthy path in ring order", views(f(), f(), h(), h()), 1, 2},
		{"a healthy path of the same group first", views(h().g(1), f().g(0), h().g(1), h().g(0)), 1, 3},
		{"a standby path when none is healthy", views(f(), f(), s()), 0, 2},
		{"none when every path failed", views(f(), f()), 1, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NextPreferred(tt.paths, tt.preferred); got != tt.want {
				t.Errorf("NextPreferred = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestRotate(t *testing.T) {
	tests := []struct {
		name      string
		paths     []PathView
		preferred int
		want      int
	}{
		{"to the next path", views(h(), h(), h()), 0, 1},
		{"wraps around", views(h(), h(), h()), 2, 0},
		{"skips failed and standby paths", views(h(), f(), s(), h()), 0, 3},
		{"crosses groups", views(h().g(0), h().g(1)), 0, 1},
		{"stays when no other path works", views(h(), f()), 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Rotate(tt.paths, tt.preferred); got != tt.want {
				t.Errorf("Rotate = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestStateOf(t *testing.T) {
	tests := []struct {
		name      string
		paths     []PathView
		policy    Policy
		preferred int
		want      []PathState
	}{
		{"failover: the preferred path is active, the others passive", views(h(), h(), f()), Failover, 1,
			[]PathState{Passive, Active, Fail}},
		{"round-robin: every healthy path is active", views(h(), h(), s()), RoundRobin, 0,
			[]PathState{Active, Active, Passive}},
		{"queue-length: paths outside the active group are passive", views(h().g(0), h().g(1), h().g(0)), QueueLength, 0,
			[]PathState{Active, Passive, Active}},
		{"service-time: a standby path carrying IO alone is passive", views(f(), s()), ServiceTime, 1,
			[]PathState{Fail, Passive}},
		{"active-read: every healthy path is active", views(h(), h()), ActiveRead, 0,
			[]PathState{Active, Active}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i, want := range tt.want {
				if got := StateOf(tt.paths, tt.policy, tt.preferred, i); got != want {
					t.Errorf("path %d: %s, want %s", i, got, want)
				}
			}
		})
	}
}

func TestChooseAllocatesNothing(t *testing.T) {
	paths := views(h().q(1).b(4096).tput(1e8), h().q(2).b(8192).tput(2e8), f(), h().g(1))
	for p := Failover; p <= ActiveRead; p++ {
		c := Choice{Policy: p, RRMinIO: 100, Size: 4096}
		if n := testing.AllocsPerRun(100, func() { Choose(paths, &c) }); n != 0 {
			t.Errorf("%s: %v allocations per choice", p, n)
		}
	}
}

func TestParsePolicyAndFailback(t *testing.T) {
	for p := Failover; p <= ActiveRead; p++ {
		got, err := ParsePolicy(p.String())
		if err != nil || got != p {
			t.Errorf("ParsePolicy(%q) = %v, %v", p, got, err)
		}
	}
	if _, err := ParsePolicy("multibus"); err == nil {
		t.Error("ParsePolicy accepted multibus")
	}
	for in, want := range map[string]Failback{
		"immediate": FailbackImmediate, "manual": FailbackManual,
		"30": Failback(30 * time.Second), "90s": Failback(90 * time.Second),
	} {
		got, err := ParseFailback(in)
		if err != nil || got != want {
			t.Errorf("ParseFailback(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"0", "-5", "soon"} {
		if _, err := ParseFailback(bad); err == nil {
			t.Errorf("ParseFailback(%q) accepted", bad)
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var hist histogram
	if got := hist.quantile(0.5); got != 0 {
		t.Errorf("empty p50 = %s", got)
	}
	for i := 0; i < 98; i++ {
		hist.record(100 * time.Microsecond)
	}
	hist.record(10 * time.Millisecond)
	hist.record(2 * time.Second)
	within := func(got, want time.Duration) bool { return got >= want && float64(got) <= float64(want)*1.125 }
	if p50 := hist.quantile(0.5); !within(p50, 100*time.Microsecond) {
		t.Errorf("p50 = %s, want 100µs within 12.5%%", p50)
	}
	if p99 := hist.quantile(0.99); !within(p99, 10*time.Millisecond) {
		t.Errorf("p99 = %s, want 10ms within 12.5%%", p99)
	}
	if max := hist.quantile(1); !within(max, 2*time.Second) {
		t.Errorf("p100 = %s, want 2s within 12.5%%", max)
	}
	for b := 1; b < histBuckets; b++ {
		if histBucket(histUpper(b)) != b || histBucket(histUpper(b-1)+1) != b {
			t.Fatalf("bucket %d does not hold (%s, %s]", b, histUpper(b-1), histUpper(b))
		}
	}
}
