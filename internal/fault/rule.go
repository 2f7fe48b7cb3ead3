package fault

import (
	"math/rand/v2"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
)

// Rule is an Injector built from clauses: which operations it matches
// (On, Range, If), how often it fires (Times, After, Prob) and what it
// does (Err, Delay, Hang, Hold, Drop, Torn, Lose). For example
//
//	fault.On(fault.Write).Range(0, 4096).Err(syscall.EIO).Times(1)
//
// fails the first write that touches the first 4 KiB. Build a rule before
// it is in use; its Hits may be read at any time. Prob and Torn draw from
// the rule's own generator, seeded by Seed (0 by default), so the same
// operations meet the same faults in every run.
type Rule struct {
	kinds  uint32 // bit per Kind; 0 matches every kind
	ranged bool
	off    int64
	end    int64
	pred   func(Op) bool
	after  int64
	times  int64 // 0: no limit
	prob   float64
	torn   bool
	fault  Fault
	mu     lockorder.Mutex
	rng    *rand.Rand
	seen   int64 // matching operations, before Prob and Times
	hits   int64
}

// On starts a rule that matches operations of the given kinds; with none,
// of every kind.
func On(kinds ...Kind) *Rule {
	r := &Rule{prob: 1, rng: rand.New(rand.NewPCG(0, 0))}
	for _, k := range kinds {
		r.kinds |= 1 << k
	}
	return r
}

// Range matches only operations that overlap [off, off+length). An
// operation without an extent (a sync) matches any range.
func (r *Rule) Range(off, length int64) *Rule {
	r.ranged, r.off, r.end = true, off, off+length
	return r
}

// If matches only operations for which pred is true. pred is called
// under the rule's lock, once per operation the other clauses match.
func (r *Rule) If(pred func(Op) bool) *Rule {
	r.pred = pred
	return r
}

// After lets the first n matching operations through.
func (r *Rule) After(n int) *Rule {
	r.after = int64(n)
	return r
}

// Times fires at most n times, then lets everything through.
func (r *Rule) Times(n int) *Rule {
	r.times = int64(n)
	return r
}

// Prob fires on a matching operation with probability p.
func (r *Rule) Prob(p float64) *Rule {
	r.prob = p
	return r
}

// Seed seeds the generator Prob and Torn draw from.
func (r *Rule) Seed(seed uint64) *Rule {
	r.rng = rand.New(rand.NewPCG(seed, seed))
	return r
}

// Err fails the operation with err.
func (r *Rule) Err(err error) *Rule {
	r.fault.Err = err
	return r
}

// Delay waits d before the operation.
func (r *Rule) Delay(d time.Duration) *Rule {
	r.fault.Delay = d
	return r
}

// Hang holds the operation until the injection point's Release or Close.
func (r *Rule) Hang() *Rule {
	r.fault.Hang = true
	return r
}

// Hold holds the operation until g opens.
func (r *Rule) Hold(g *Gate) *Rule {
	r.fault.Hold = g
	return r
}

// Drop acknowledges a write and changes nothing.
func (r *Rule) Drop() *Rule {
	r.fault.Drop = true
	return r
}

// Torn lands a prefix of the write, cut at a sector boundary chosen by
// the rule's generator (at least one sector, never the whole write; a
// write of one sector lands whole).
func (r *Rule) Torn() *Rule {
	r.torn = true
	return r
}

// TornAt lands only the first sectors of the write.
func (r *Rule) TornAt(sectors int) *Rule {
	r.fault.Tear = sectors
	return r
}

// Lose keeps the write in the volatile cache until the next Sync (see
// Fault.Lose).
func (r *Rule) Lose() *Rule {
	r.fault.Lose = true
	return r
}

// Fault sets everything the rule does at once.
func (r *Rule) Fault(f Fault) *Rule {
	r.fault = f
	return r
}

// Hits is how many operations the rule has fired on.
func (r *Rule) Hits() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hits
}

func (r *Rule) matches(op Op) bool {
	if r.kinds != 0 && r.kinds&(1<<op.Kind) == 0 {
		return false
	}
	if r.ranged && op.Len > 0 && (op.Off >= r.end || op.Off+op.Len <= r.off) {
		return false
	}
	return true
}

// Inject implements Injector.
func (r *Rule) Inject(op Op) Fault {
	if !r.matches(op) {
		return Fault{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pred != nil && !r.pred(op) {
		return Fault{}
	}
	r.seen++
	if r.seen <= r.after || (r.times > 0 && r.hits >= r.times) {
		return Fault{}
	}
	if r.prob < 1 && r.rng.Float64() >= r.prob {
		return Fault{}
	}
	r.hits++
	f := r.fault
	if r.torn && op.Kind == Write {
		if sectors := (op.Len + SectorSize - 1) / SectorSize; sectors > 1 {
			f.Tear = 1 + r.rng.IntN(int(sectors-1))
		}
	}
	return f
}
