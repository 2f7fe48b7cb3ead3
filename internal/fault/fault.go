package fault

import (
	"errors"
	"fmt"
	"time"
)

// Kind is the kind of an operation.
type Kind uint8

// Operation kinds. A block device's flush is Sync; an NBD write-zeroes is
// Zero.
const (
	Read Kind = iota
	Write
	Sync
	Zero
	Trim
	numKinds
)

func (k Kind) String() string {
	switch k {
	case Read:
		return "read"
	case Write:
		return "write"
	case Sync:
		return "sync"
	case Zero:
		return "zero"
	case Trim:
		return "trim"
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// Op is one operation. N numbers the operations of one kind from 1, in
// the order they reached the injection point.
type Op struct {
	Kind     Kind
	Off, Len int64
	// FUA: a write that must be durable when it returns.
	FUA bool
	N   int64
}

// SectorSize is the unit a torn write keeps or loses.
const SectorSize = 512

// Fault is what happens to one operation. The zero Fault lets it through.
// Delay, then Hang or Hold, come first; then Err fails the operation, or
// Drop, Tear or Lose change what a write leaves.
type Fault struct {
	// Delay waits this long before the operation.
	Delay time.Duration
	// Hang holds the operation until the injection point's Release or
	// Close.
	Hang bool
	// Hold holds the operation until the gate opens.
	Hold *Gate
	// Err fails the operation: nothing is done, unless Tear says a
	// prefix of a write landed.
	Err error
	// Drop makes a write report success but change nothing: a lost write.
	Drop bool
	// Tear, for a write, keeps only its first Tear sectors on the device,
	// as if power failed in the middle; the write reports success (or
	// Err with the bytes kept). Zero means no tear.
	Tear int
	// Lose keeps a write (or zero) in a volatile cache until the next
	// Sync: reads see it, a power loss takes it away. A FUA write is
	// durable when it returns and is never lost this way.
	Lose bool
}

// IsZero reports whether f lets the operation through untouched.
func (f Fault) IsZero() bool { return f == Fault{} }

// injects reports whether f fails, holds or changes the operation (a
// delay alone does not count).
func (f Fault) injects() bool {
	return f.Err != nil || f.Hang || f.Hold != nil || f.Drop || f.Tear > 0 || f.Lose
}

// Kept is how many of a write's length bytes land under f.
func (f Fault) Kept(length int) int {
	switch {
	case f.Drop:
		return 0
	case f.Tear > 0 && f.Tear*SectorSize < length:
		return f.Tear * SectorSize
	case f.Err != nil && f.Tear == 0:
		return 0
	}
	return length
}

// Write carries out a write of p under f, the fault Point.Before returned
// with err: write stores the part of p that lands (not called when none
// does), and Write returns what the write reports: len(p) and nil when
// the fault hides what it did, the bytes that landed and err when it
// fails.
func (f Fault) Write(p []byte, err error, write func(kept []byte) error) (int, error) {
	if err != nil && (f.Tear == 0 || err != f.Err) {
		return 0, err
	}
	kept := p[:f.Kept(len(p))]
	if len(kept) > 0 {
		if werr := write(kept); werr != nil {
			return 0, werr
		}
	}
	if err != nil {
		return len(kept), err
	}
	return len(p), nil
}

// Injector chooses the fault of each operation. It is called concurrently
// and must not block.
type Injector interface {
	Inject(Op) Fault
}

// InjectorFunc is an Injector.
type InjectorFunc func(Op) Fault

// Inject implements Injector.
func (f InjectorFunc) Inject(op Op) Fault { return f(op) }

// ErrInjected is the error the helpers inject: an EIO-like device error.
var ErrInjected = errors.New("fault: injected IO error")

// ErrClosed is what a held or later operation returns once its injection
// point is closed.
var ErrClosed = errors.New("fault: closed")

// Always injects f into every operation.
func Always(f Fault) Injector { return InjectorFunc(func(Op) Fault { return f }) }

// Step is one phase of a Schedule.
type Step struct {
	For   time.Duration
	Fault Fault
}

// Schedule injects each step's fault for its duration, counted from
// start, and nothing after the last step; with repeat it starts over.
// It reads the time package's clock, which testing/synctest fakes.
func Schedule(start time.Time, repeat bool, steps ...Step) Injector {
	var total time.Duration
	for _, s := range steps {
		total += s.For
	}
	return InjectorFunc(func(Op) Fault {
		at := time.Since(start)
		if at < 0 || total <= 0 {
			return Fault{}
		}
		if repeat {
			at %= total
		}
		for _, s := range steps {
			if at < s.For {
				return s.Fault
			}
			at -= s.For
		}
		return Fault{}
	})
}

// Flapping fails every operation with ErrInjected for down, then lets
// them through for up, over and over from start.
func Flapping(start time.Time, down, up time.Duration) Injector {
	return Schedule(start, true, Step{For: down, Fault: Fault{Err: ErrInjected}}, Step{For: up})
}
