package nbdclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/replvol/replvol/internal/lockorder"
)

// MaxConnections bounds a Pool's connections.
const MaxConnections = 16

// Pool is one export over several connections when the server offers multi-conn (one
// otherwise): reads and writes go round the connections that still work, and a flush on one
// covers the writes answered on all, as multi-conn promises. Refresh connects again when the
// export grew.
type Pool struct {
	// addr, name, want and opts are what Open was given: Refresh connects again with them.
	addr, name string
	want       int
	opts       Options

	// mu is held shared by each request while it uses conns, and exclusively by Refresh while
	// it puts new connections in their place: the old ones then have no request in flight
	// when they are flushed and closed.
	mu     lockorder.RWMutex
	conns  []*Conn
	export Export
	next   atomic.Uint64
}

// Open connects to export at addr: one connection, and when the server offers multi-conn n-1
// more (n is clamped to 1..MaxConnections).
func Open(ctx context.Context, addr, export string, n int, opts Options) (*Pool, error) {
	n = max(1, min(n, MaxConnections))
	conns, ex, err := dialAll(ctx, addr, export, n, opts)
	if err != nil {
		return nil, err
	}
	return &Pool{addr: addr, name: export, want: n, opts: opts, conns: conns, export: ex}, nil
}

// dialAll makes the connections of a Pool: one, and n-1 more when the server offers
// multi-conn; each must be told the export the first was.
func dialAll(ctx context.Context, addr, export string, n int, opts Options) ([]*Conn, Export, error) {
	first, err := Dial(ctx, addr, export, opts)
	if err != nil {
		return nil, Export{}, err
	}
	conns, ex := []*Conn{first}, first.Export()
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	if !ex.CanMultiConn() {
		n = 1
	}
	for len(conns) < n {
		c, err := Dial(ctx, addr, export, opts)
		if err != nil {
			closeAll()
			return nil, Export{}, fmt.Errorf("connection %d of %d: %w", len(conns)+1, n, err)
		}
		if got := c.Export(); got.Size != ex.Size || got.Flags != ex.Flags {
			c.Close()
			closeAll()
			return nil, Export{}, fmt.Errorf("%w: connection %d sees a %d-byte export with flags %#x, the first %d bytes with %#x", ErrProtocol, len(conns)+1, got.Size, got.Flags, ex.Size, ex.Flags)
		}
		conns = append(conns, c)
	}
	return conns, ex, nil
}

// Export is what the server told of the export (its size as the last Refresh found it).
func (p *Pool) Export() Export {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.export
}

// Size is the export's size in bytes.
func (p *Pool) Size() int64 { return p.Export().Size }

// Connections is how many connections the pool holds.
func (p *Pool) Connections() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.conns)
}

// Err is nil while a connection works, else why none does.
func (p *Pool) Err() error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	_, err := p.pick()
	return err
}

// pick returns the next connection that works, going round them; mu is held.
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
	p.mu.RLock()
	defer p.mu.RUnlock()
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

// one runs op on the next connection that works.
func (p *Pool) one(op func(*Conn) error) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	c, err := p.pick()
	if err != nil {
		return err
	}
	return op(c)
}

// Flush makes every write answered before it durable (see Conn.Flush). With several
// connections it is sent on one: multi-conn makes it cover all.
func (p *Pool) Flush() error {
	return p.one((*Conn).Flush)
}

// Trim passes a discard on (see Conn.Trim).
func (p *Pool) Trim(off, length int64) error {
	return p.one(func(c *Conn) error { return c.Trim(off, length) })
}

// WriteZeroes zeroes a range (see Conn.WriteZeroes).
func (p *Pool) WriteZeroes(off, length int64) error {
	return p.one(func(c *Conn) error { return c.WriteZeroes(off, length) })
}

// Refresh asks the server what size the export has now (NBD_OPT_INFO on a connection of its
// own: NBD tells no client that an export grew, and a connection keeps the size it was told).
// When it grew, Refresh connects again as Open did (the new connections are told the new
// size), waits until no request is in flight, flushes the old connections, puts the new ones
// in their place, and closes the old ones: requests made meanwhile wait, none fails. New
// connections that see the export otherwise than the old ones did (read-only: the server no
// longer serves it as primary) are refused, and the pool stays as it was. It returns the size;
// a smaller export is ErrShrunk, and Size stays.
func (p *Pool) Refresh(ctx context.Context) (int64, error) {
	cur := p.Export()
	ex, err := askInfo(ctx, p.addr, p.name, p.opts)
	switch {
	case err != nil:
		return cur.Size, fmt.Errorf("%s: %w", p.addr, err)
	case ex.Size < cur.Size:
		return cur.Size, fmt.Errorf("%w: %s tells %d bytes, %d are served: the size stays", ErrShrunk, p.addr, ex.Size, cur.Size)
	case ex.Size == cur.Size:
		return cur.Size, nil
	}
	conns, fresh, err := dialAll(ctx, p.addr, p.name, p.want, p.opts)
	if err != nil {
		return cur.Size, fmt.Errorf("the export grew to %d bytes; connecting again to %s: %w", ex.Size, p.addr, err)
	}
	closeAll := func(conns []*Conn) {
		for _, c := range conns {
			c.Close()
		}
	}
	if fresh.Flags != cur.Flags || fresh.Size < cur.Size {
		closeAll(conns)
		return cur.Size, fmt.Errorf("%w: connected again to %s, it serves a %d-byte export with flags %#x; %d bytes with %#x are served: the connections stay", ErrProtocol, p.addr, fresh.Size, fresh.Flags, cur.Size, cur.Flags)
	}
	p.mu.Lock()
	old := p.conns
	// The old connections' writes were answered; a flush on each makes them durable BEFORE
	// the connections close, whether or not the server's multi-conn makes a flush on a new
	// connection cover them.
	var errs []error
	for _, c := range old {
		if c.Err() == nil {
			if err := c.Flush(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		p.mu.Unlock()
		closeAll(conns)
		return cur.Size, fmt.Errorf("the export grew to %d bytes; the flush before connecting again failed, and the connections stay: %w", fresh.Size, errors.Join(errs...))
	}
	p.conns, p.export = conns, fresh
	p.mu.Unlock()
	closeAll(old)
	return fresh.Size, nil
}

// askInfo asks the server at addr about export on a connection of its own (NBD_OPT_INFO), which
// carries no data and ends with the handshake.
func askInfo(ctx context.Context, addr, export string, opts Options) (Export, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return Export{}, err
	}
	defer raw.Close()
	return Info(ctx, raw, export, opts.TLS)
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
