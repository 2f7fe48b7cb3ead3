package replication

import (
	"math/rand/v2"
	"testing"
	"time"
)

// lagOp is one event fed to a Lag: Do is complete, ack, mark, resync,
// caught-up or disconnect.
type lagOp struct {
	Do    string
	Seq   uint64
	Bytes int64
	At    time.Duration
}

func (op lagOp) apply(l *Lag, start time.Time) {
	switch op.Do {
	case "complete":
		l.Completed(op.Seq, op.Bytes, start.Add(op.At))
	case "ack":
		l.PeerAcked(op.Seq)
	case "mark":
		l.Marked(op.Bytes, start.Add(op.At))
	case "resync":
		l.Resynced(op.Bytes)
	case "caught-up":
		l.CaughtUp()
	case "disconnect":
		l.Disconnected()
	default:
		panic("unknown lag op " + op.Do)
	}
}

func done(seq uint64, bytes int64, at time.Duration) lagOp {
	return lagOp{Do: "complete", Seq: seq, Bytes: bytes, At: at}
}
func ack(seq uint64) lagOp                     { return lagOp{Do: "ack", Seq: seq} }
func mark(bytes int64, at time.Duration) lagOp { return lagOp{Do: "mark", Bytes: bytes, At: at} }
func resync(bytes int64) lagOp                 { return lagOp{Do: "resync", Bytes: bytes} }

var (
	caughtUp   = lagOp{Do: "caught-up"}
	disconnect = lagOp{Do: "disconnect"}
)

func TestLag(t *testing.T) {
	const s = time.Second
	cases := []struct {
		name      string
		ops       []lagOp
		now       time.Duration
		wantBytes int64
		wantAge   time.Duration
	}{
		{"no writes, no lag", nil, 10 * s, 0, 0},
		{"a write acknowledged locally and not by the peer counts", []lagOp{done(1, 4096, 1*s)},
			4 * s, 4096, 3 * s},
		{"the peer's ack takes its writes away and the age moves on", []lagOp{done(1, 4096, 1*s), done(2, 8192, 2*s), ack(1)},
			5 * s, 8192, 3 * s},
		{"an ack covers every earlier seq", []lagOp{done(1, 4096, 1*s), done(2, 4096, 2*s), done(3, 4096, 3*s), ack(3)},
			5 * s, 0, 0},
		{"a peer ack before the local ack counts nothing", []lagOp{ack(5), done(5, 4096, 1*s)},
			5 * s, 0, 0},
		{"an old ack after a newer one changes nothing", []lagOp{done(1, 4096, 1*s), done(2, 4096, 2*s), ack(1), ack(0)},
			5 * s, 4096, 3 * s},
		{"writes completing out of seq order: the age is the oldest", []lagOp{done(3, 1, 1*s), done(1, 10, 3*s), done(2, 100, 2*s)},
			10 * s, 111, 9 * s},
		{"out of seq order, an ack of the first leaves the oldest", []lagOp{done(3, 1, 1*s), done(1, 10, 3*s), done(2, 100, 2*s), ack(1)},
			10 * s, 101, 9 * s},
		{"blocks marked while Ahead count, aged from the first mark", []lagOp{mark(4096, 1*s), mark(4096, 2*s)},
			5 * s, 8192, 4 * s},
		{"a partial catch-up keeps the age of the oldest mark", []lagOp{mark(4096, 1*s), mark(4096, 2*s), resync(4096)},
			5 * s, 4096, 4 * s},
		{"a catch-up that clears everything ends the lag", []lagOp{mark(4096, 1*s), resync(8192)},
			5 * s, 0, 0},
		{"marks after a finished catch-up are aged afresh", []lagOp{mark(4096, 1*s), mark(4096, 1*s), caughtUp, mark(4096, 4*s)},
			5 * s, 4096, 1 * s},
		{"the older of marks and unacked writes gives the age", []lagOp{done(1, 4096, 2*s), mark(8192, 3*s)},
			5 * s, 12288, 3 * s},
		{"a disconnect turns the unacked writes into marks of the same age", []lagOp{done(1, 4096, 1*s), done(2, 4096, 2*s), disconnect, ack(2)},
			5 * s, 8192, 4 * s},
		{"after a disconnect the next connection's seqs count again", []lagOp{done(7, 4096, 1*s), ack(7), disconnect, done(1, 4096, 3*s)},
			5 * s, 4096, 2 * s},
	}
	start := time.Unix(1_000_000, 0)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var l Lag
			for _, op := range c.ops {
				op.apply(&l, start)
			}
			if got := l.Bytes(); got != c.wantBytes {
				t.Errorf("Bytes %d, want %d", got, c.wantBytes)
			}
			if got := l.Age(start.Add(c.now)); got != c.wantAge {
				t.Errorf("Age %v, want %v", got, c.wantAge)
			}
		})
	}
}

// TestLagMatchesAModel feeds random completions (near seq order, some out
// of it), acks, marks and disconnects to a Lag and to a plain list, and
// checks Bytes and Age after every event, and that the queue does not
// keep what was acknowledged.
func TestLagMatchesAModel(t *testing.T) {
	type write struct {
		bytes int64
		at    time.Time
	}
	r := rand.New(rand.NewPCG(3, 4))
	start := time.Unix(1_000_000, 0)
	var l Lag
	model := map[uint64]write{}
	var acked, issued uint64
	var marked int64
	var markedAt time.Time
	var waiting []uint64 // issued, not yet completed locally
	now := start
	for step := range 200_000 {
		now = now.Add(time.Duration(r.IntN(3)) * time.Millisecond)
		switch k := r.IntN(100); {
		case k < 45:
			issued++
			waiting = append(waiting, issued)
		case k < 80 && len(waiting) > 0:
			i := r.IntN(min(len(waiting), 4)) // near seq order
			seq := waiting[i]
			waiting = append(waiting[:i], waiting[i+1:]...)
			b := int64(1+r.IntN(16)) * 4096
			l.Completed(seq, b, now)
			if seq > acked {
				model[seq] = write{b, now}
			}
		case k < 97 && issued > acked:
			acked += uint64(1 + r.IntN(int(issued-acked)))
			l.PeerAcked(acked)
			for seq := range model {
				if seq <= acked {
					delete(model, seq)
				}
			}
		case k < 98:
			b := int64(4096)
			if marked == 0 {
				markedAt = now
			}
			marked += b
			l.Marked(b, now)
		case k < 99:
			for _, w := range model {
				if marked == 0 || w.at.Before(markedAt) {
					markedAt = w.at
				}
				marked += w.bytes
			}
			clear(model)
			waiting, acked, issued = waiting[:0], 0, 0
			l.Disconnected()
		default:
			marked = 0
			l.CaughtUp()
		}
		wantBytes := marked
		var oldest time.Time
		if marked > 0 {
			oldest = markedAt
		}
		for _, w := range model {
			wantBytes += w.bytes
			if oldest.IsZero() || w.at.Before(oldest) {
				oldest = w.at
			}
		}
		var wantAge time.Duration
		if !oldest.IsZero() {
			wantAge = now.Sub(oldest)
		}
		if got := l.Bytes(); got != wantBytes {
			t.Fatalf("step %d: Bytes %d, want %d", step, got, wantBytes)
		}
		if got := l.Age(now); got != wantAge {
			t.Fatalf("step %d: Age %v, want %v", step, got, wantAge)
		}
		if live := len(l.queue) - l.head; live != len(model) || len(l.queue) > 2*len(model)+1 {
			t.Fatalf("step %d: queue holds %d live of %d, the model %d", step, live, len(l.queue), len(model))
		}
	}
}

func TestThrottleForLag(t *testing.T) {
	cases := []struct {
		name      string
		maxLag    int64
		lag       int64
		connected bool
		want      bool
	}{
		{"max_lag 0 never throttles", 0, 1 << 40, true, false},
		{"below max_lag a write goes", 1 << 20, 1<<20 - 1, true, false},
		{"at max_lag a write waits", 1 << 20, 1 << 20, true, true},
		{"above max_lag a write waits", 1 << 20, 5 << 20, true, true},
		{"a disconnected peer's lag throttles nothing", 1 << 20, 5 << 20, false, false},
	}
	for _, c := range cases {
		if got := ThrottleForLag(c.maxLag, c.lag, c.connected); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}
