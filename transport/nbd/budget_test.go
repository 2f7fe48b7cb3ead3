package nbd

// These tests pin the pieces that bound a Server's memory: the node budget serves waiters in
// arrival order (a large request is never overtaken, a withdrawn one lets the next through); the
// buffer pool keeps at most its cap, reuses what it keeps without allocating, and gives back
// what stayed unused for a trim interval; and Config.Validate refuses budgets a maximum-length
// request could never fit in.

import (
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func granted(w *budgetWaiter) bool {
	select {
	case <-w.ready:
		return true
	default:
		return false
	}
}

func TestNodeBudgetServesWaitersInArrivalOrder(t *testing.T) {
	b := &nodeBudget{size: 100}
	if w := b.enqueue(60); w != nil {
		t.Fatal("60 of 100 free bytes not granted at once")
	}
	large := b.enqueue(50)
	small := b.enqueue(10)
	if large == nil || small == nil || granted(large) || granted(small) {
		t.Fatal("a small request overtook a waiting large one")
	}
	b.release(60)
	if !granted(large) || !granted(small) || b.heldBytes() != 60 {
		t.Fatalf("after the release: large %v small %v held %d, want both granted, 60 held", granted(large), granted(small), b.heldBytes())
	}
	if b.cancel(large) {
		t.Fatal("cancel of a granted waiter reported it withdrawn: its bytes would leak")
	}

	// A withdrawn head of the queue lets the waiters behind it through.
	head := b.enqueue(50)
	behind := b.enqueue(30)
	if granted(head) || granted(behind) {
		t.Fatal("granted beyond the budget or out of order")
	}
	if !b.cancel(head) || !granted(behind) || b.heldBytes() != 90 {
		t.Fatalf("after withdrawing the head: behind granted %v, held %d, want true, 90", granted(behind), b.heldBytes())
	}
	b.release(90)
	if b.heldBytes() != 0 || b.waiters.Len() != 0 {
		t.Fatalf("held %d with %d waiters at the end", b.heldBytes(), b.waiters.Len())
	}
}

func TestBufferPoolKeepsAtMostItsCapAndReusesIt(t *testing.T) {
	const size = 1 << 20
	mapped := runtime.GOOS == "linux"
	p := newBufferPool(3 * size)
	p.trimInterval = time.Hour // trimmed by hand below
	var bufs []*buffer
	for range 4 {
		buf := p.get(size - 1)
		if len(buf.b) != size-1 || cap(buf.b) != size {
			t.Fatalf("get(%d): len %d cap %d", size-1, len(buf.b), cap(buf.b))
		}
		if buf.mapped != mapped {
			t.Fatalf("a 1 MiB buffer: mapped %v on %s", buf.mapped, runtime.GOOS)
		}
		buf.b[0], buf.b[size-2] = 1, 2 // usable to its end
		bufs = append(bufs, buf)
	}
	for _, buf := range bufs {
		p.put(buf)
	}
	if got := p.pooled.Load(); got != 3*size {
		t.Fatalf("pool keeps %d bytes, want its cap %d", got, 3*size)
	}
	if mapped && (p.emptyMapped.Load() != size || bufs[3].b[0] != 0) {
		t.Fatalf("the buffer over the cap: %d bytes of empty mappings, first byte %d; want its pages given back", p.emptyMapped.Load(), bufs[3].b[0])
	}
	if reused := p.get(size); reused != bufs[2] {
		t.Fatal("get did not reuse the last buffer put")
	} else {
		p.put(reused)
	}
	// Unused since the trim before last: given back.
	p.trim()
	if got := p.pooled.Load(); got != 3*size {
		t.Fatalf("the first trim freed buffers used since the last one: %d bytes left", got)
	}
	p.trim()
	if got := p.pooled.Load(); got != 0 {
		t.Fatalf("%d bytes left after a trim interval without use", got)
	}
	if !mapped {
		return
	}
	if got := p.emptyMapped.Load(); got != 4*size {
		t.Fatalf("%d bytes of empty mappings after the trims, want all 4 buffers'", got)
	}
	// An empty mapping is reused before a new one is made, and reads back as zeroes.
	if reused := p.get(size); !slices.Contains(bufs, reused) || reused.b[0] != 0 {
		t.Fatal("get made a new mapping while empty ones were kept, or an empty one kept its data")
	} else {
		p.put(reused)
	}
	p.unmapAll()
	if p.pooled.Load() != 0 || p.emptyMapped.Load() != 0 {
		t.Fatalf("after unmapAll: %d pooled, %d mapped", p.pooled.Load(), p.emptyMapped.Load())
	}
}

func TestBufferPoolTrimsItselfWhenIdle(t *testing.T) {
	p := newBufferPool(64 << 20)
	p.trimInterval = 5 * time.Millisecond
	p.put(p.get(32 << 20))
	p.put(p.get(4096))
	deadline := time.Now().Add(10 * time.Second)
	for p.pooled.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("an idle pool still keeps %d bytes", p.pooled.Load())
		}
		time.Sleep(time.Millisecond)
	}
	p.unmapAll()
}

func TestConfigValidate(t *testing.T) {
	resolver := fuzzResolver{}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" for valid
	}{
		{"only a resolver: every default", Config{Resolver: resolver}, ""},
		{"no resolver", Config{}, "Resolver is nil"},
		{"connection budget below the maximum request", Config{Resolver: resolver, ConnectionBudget: 1 << 20}, "ConnectionBudget"},
		{"node budget below the maximum request", Config{Resolver: resolver, NodeBudget: MaxRequestLength - 1}, "NodeBudget"},
		{"reserve above the connection budget", Config{Resolver: resolver, ConnectionReserve: 65 << 20}, "ConnectionReserve"},
		{"budgets of exactly the maximum request", Config{Resolver: resolver, ConnectionBudget: MaxRequestLength, NodeBudget: MaxRequestLength}, ""},
		{"negative stall timeout", Config{Resolver: resolver, StallTimeout: -time.Second}, "negative"},
		{"negative max connections", Config{Resolver: resolver, MaxConnections: -1}, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}
