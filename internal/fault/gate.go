package fault

import (
	"context"

	"github.com/replvol/replvol/internal/lockorder"
)

// Gate holds operations while it is shut: a slow or stuck device. Each
// held operation is announced on Entered first (up to its buffer of
// 1024; later announcements are not made while it is full), so a test
// knows an operation is in flight without sleeping.
type Gate struct {
	Entered chan Op
	mu      lockorder.Mutex
	shut    chan struct{} // nil while open
}

// NewGate returns a shut gate.
func NewGate() *Gate {
	return &Gate{Entered: make(chan Op, 1024), shut: make(chan struct{})}
}

// Open lets every held operation through, and every later one until Shut.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
}

// Shut holds every later operation until Open or Release.
func (g *Gate) Shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut == nil {
		g.shut = make(chan struct{})
	}
}

// Release lets the operations held now through and holds later ones.
func (g *Gate) Release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
	}
	g.shut = make(chan struct{})
}

// Wait holds op while the gate is shut: it returns nil once the gate lets
// it through, ctx.Err() when ctx ends, and ErrClosed when closed is closed
// (closed may be nil).
func (g *Gate) Wait(ctx context.Context, op Op, closed <-chan struct{}) error {
	g.mu.Lock()
	shut := g.shut
	g.mu.Unlock()
	if shut == nil {
		return nil
	}
	select {
	case g.Entered <- op:
	default:
	}
	select {
	case <-shut:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-closed:
		return ErrClosed
	}
}
