package nbdclient

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
)

// MaxConnections bounds a Pool's connections.
const MaxConnections = 16

// Pool is one export over several connections when the server offers multi-conn (one
// otherwise): reads and writes go round the connections that still work, and a flush on one
// covers the writes answered on all, as multi-conn promises.
type Pool struct {
	conns  []*Conn
	export Export
	next   atomic.Uint64
}

// Open connects to export at addr: one connection, and when the server offers multi-conn n-1
// more (n is clamped to 1..MaxConnections).
func Open(ctx context.Context, addr, export string, n int, opts Options) (*Pool, error) {
	n = max(1, min(n, MaxConnections))
	first, err := Dial(ctx, addr, export, opts)
	if err != nil {
		return nil, err
	}
	p := &Pool{conns: []*Conn{first}, export: first.Export()}
	if !p.export.CanMultiConn() {
		n = 1
	}
	for len(p.conns) < n {
		c, err := Dial(ctx, addr, export, opts)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("connection %d of %d: %w", len(p.conns)+1, n, err)
		}
		if got := c.Export(); got.Size != p.export.Size || got.Flags != p.export.Flags {
			c.Close()
			p.Close()
			return nil, fmt.Errorf("%w: connection %d sees a %d-byte export with flags %#x, the first %d bytes with %#x", ErrProtocol, len(p.conns)+1, got.Size, got.Flags, p.export.Size, p.export.Flags)
		}
		p.conns = append(p.conns, c)
	}
	return p, nil
}

// Export is what the server told of the export.
func (p *Pool) Export() Export { return p.export }

// Size is the export's size in bytes.
func (p *Pool) Size() int64 { return p.export.Size }

// Connections is how many connections the pool holds.
func (p *Pool) Connections() int { return len(p.conns) }

// Err is nil while a connection works, else why none does.
func (p *Pool) Err() error {
	_, err := p.pick()
	return err
}

// pick returns the next connection that works, going round them.
func (p *Pool) pick() (*Conn, error) {
	start := p.next.Add(1)
	var first error
	for i := range uint64(len(p.conns)) {
		c := p.conns[(start+i)%uint64(len(p.conns))]
		err := c.Err()
		if err == nil {
			return c, nil
		}
		if first == nil || errors.Is(first, ErrClosed) {
			first = err
		}
	}
	return nil, first
}

// ReadAt reads len(p) bytes at off: long reads are cut into requests spread over the
// connections in turn.
func (p *Pool) ReadAt(b []byte, off int64) (int, error) {
	return p.each(b, off, (*Conn).ReadAt)
}

// WriteAt writes b at off (see Conn.WriteAt).
func (p *Pool) WriteAt(b []byte, off int64) (int, error) {
	return p.each(b, off, (*Conn).WriteAt)
}

func (p *Pool) each(b []byte, off int64, op func(*Conn, []byte, int64) (int, error)) (int, error) {
	max := p.export.maxRequest()
	for done := 0; done < len(b); {
		c, err := p.pick()
		if err != nil {
			return done, err
		}
		n := min(len(b)-done, max)
		if _, err := op(c, b[done:done+n], off+int64(done)); err != nil {
			return done, err
		}
		done += n
	}
	return len(b), nil
}

// Flush makes every write answered before it durable (see Conn.Flush). With several
// connections it is sent on one: multi-conn makes it cover all.
func (p *Pool) Flush() error {
	c, err := p.pick()
	if err != nil {
		return err
	}
	return c.Flush()
}

// Trim passes a discard on (see Conn.Trim).
func (p *Pool) Trim(off, length int64) error {
	c, err := p.pick()
	if err != nil {
		return err
	}
	return c.Trim(off, length)
}

// WriteZeroes zeroes a range (see Conn.WriteZeroes).
func (p *Pool) WriteZeroes(off, length int64) error {
	c, err := p.pick()
	if err != nil {
		return err
	}
	return c.WriteZeroes(off, length)
}

// Close closes every connection (see Conn.Close).
func (p *Pool) Close() error {
	var errs []error
	for _, c := range p.conns {
		if err := c.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
