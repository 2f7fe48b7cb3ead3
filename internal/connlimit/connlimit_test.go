package connlimit

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/clock"
)

// fakeConn is a connection from an address that records its Close: the
// rules need no socket.
type fakeConn struct {
	net.Conn
	remote net.Addr
	mu     sync.Mutex
	closed bool
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c *fakeConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}
func (c *fakeConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func from(ip string) *fakeConn {
	return &fakeConn{remote: net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(ip), 40000))}
}

// bench is a Limiter on a fake clock, logging into a buffer.
type bench struct {
	t     *testing.T
	l     *Limiter
	clock *clock.Fake
	log   *bytes.Buffer
}

func newBench(t *testing.T, cfg Config) *bench {
	b := &bench{t: t, clock: clock.NewFake(time.Unix(1000, 0)), log: &bytes.Buffer{}}
	cfg.Clock = b.clock
	cfg.Logger = slog.New(slog.NewTextHandler(b.log, nil))
	if cfg.Port == "" {
		cfg.Port = "test"
	}
	b.l = New(cfg)
	return b
}

// admit admits a connection from ip, which must be let in.
func (b *bench) admit(ip string) (*Slot, *fakeConn) {
	b.t.Helper()
	c := from(ip)
	s, err := b.l.Admit(c)
	if err != nil {
		b.t.Fatalf("a connection from %s was refused: %v (%+v)", ip, err, b.l.Stats())
	}
	return s, c
}

// refuse admits a connection from ip, which must be refused for want.
func (b *bench) refuse(ip string, want Reason) {
	b.t.Helper()
	c := from(ip)
	s, err := b.l.Admit(c)
	var refused *Refused
	if !errors.As(err, &refused) || refused.Reason != want {
		b.t.Fatalf("a connection from %s: slot %v, error %v; want it refused for %s", ip, s, err, want)
	}
	if !c.isClosed() {
		b.t.Fatalf("a refused connection from %s was left open", ip)
	}
}

// TestOneAddressIsHeldToItsShare: a stranger's address holds at most
// PerSourceHandshakes unfinished handshakes and PerSourceOpen connections
// in all, while other addresses get in; the cluster's own addresses and
// local connections are held to no share of their own; a slot given back
// is taken again.
func TestOneAddressIsHeldToItsShare(t *testing.T) {
	b := newBench(t, Config{MaxOpen: 100, PerSourceOpen: 4, PerSourceHandshakes: 2,
		Known: NewKnown(netip.MustParseAddr("10.0.0.1"))})
	s1, _ := b.admit("10.0.0.9")
	s2, _ := b.admit("10.0.0.9")
	b.refuse("10.0.0.9", SourceHandshakes)
	b.admit("10.0.0.8") // another address
	if !s1.Negotiated() || !s2.Negotiated() {
		t.Fatal("Negotiated of an open slot says the limiter closed it")
	}
	s3, _ := b.admit("10.0.0.9")
	s4, _ := b.admit("10.0.0.9")
	s3.Negotiated()
	s4.Negotiated()
	b.refuse("10.0.0.9", SourceOpen)
	s1.Release()
	s1.Release() // twice: nothing more
	b.admit("10.0.0.9")
	b.refuse("10.0.0.9", SourceOpen)
	for range 10 {
		b.admit("10.0.0.1") // a node of the cluster
		b.l.Admit(&fakeConn{remote: &net.UnixAddr{Name: "@", Net: "unix"}})
	}
	st := b.l.Stats()
	if st.Open != 25 || st.Sources != 4 || st.StrangerOpen != 5 || st.Count(SourceOpen) != 2 || st.Count(SourceHandshakes) != 1 || st.Refused() != 3 {
		t.Fatalf("stats %+v: want 25 open from 4 sources, 5 of strangers, 3 refused", st)
	}
}

// TestAPortKeepsSlotsForItsNodes: strangers fill at most StrangerOpen of
// the port and StrangerHandshakes of its handshakes; a known address
// gets the rest.
func TestAPortKeepsSlotsForItsNodes(t *testing.T) {
	b := newBench(t, Config{MaxOpen: 8, MaxHandshakes: 6, StrangerOpen: 5, StrangerHandshakes: 3, PerSourceOpen: 5, PerSourceHandshakes: 3,
		Known: NewKnown(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"))})
	var slots []*Slot
	for _, ip := range []string{"10.0.1.1", "10.0.1.2", "10.0.1.3"} {
		s, _ := b.admit(ip)
		slots = append(slots, s)
	}
	b.refuse("10.0.1.4", HandshakesFull) // the strangers' handshakes are taken
	for _, s := range slots {
		s.Negotiated()
	}
	b.admit("10.0.1.4")
	b.admit("10.0.1.5")
	b.refuse("10.0.1.6", PortFull) // the strangers' connections are taken
	for _, s := range slots {
		s.Release() // give back 3 of the 5 strangers'
	}
	for range 4 {
		b.admit("10.0.0.1") // the nodes' handshakes: beside the strangers' two, up to MaxHandshakes
	}
	// Every handshake is taken: a node's new one closes a stranger's.
	b.admit("10.0.0.2")
	b.admit("10.0.0.2")
	b.refuse("10.0.0.2", HandshakesFull) // and none is left to close
	st := b.l.Stats()
	if st.Handshakes != 6 || st.Open != 6 || st.StrangerOpen != 0 || st.Count(Evicted) != 2 {
		t.Fatalf("stats %+v: want 6 handshakes, all of nodes, the strangers' two closed", st)
	}
}

// TestAFullPortClosesTheOldestHandshakeOfTheBiggestHolder: when the port
// is full, a connection from a new address closes the oldest unfinished
// handshake of the address that holds the most, rather than be refused;
// a flood cannot close its own to make room for itself, nor a finished
// connection; a known address takes a stranger's slot even from an
// address that holds no more than it.
func TestAFullPortClosesTheOldestHandshakeOfTheBiggestHolder(t *testing.T) {
	b := newBench(t, Config{MaxOpen: 6, StrangerOpen: 6, StrangerHandshakes: 6, PerSourceOpen: 4, PerSourceHandshakes: 4,
		Known: NewKnown(netip.MustParseAddr("10.0.0.1"))})
	var floodSlots []*Slot
	var floodConns []*fakeConn
	for range 4 {
		s, c := b.admit("10.9.9.9")
		floodSlots, floodConns = append(floodSlots, s), append(floodConns, c)
		b.clock.Advance(time.Millisecond)
	}
	other, _ := b.admit("10.8.8.8")
	b.clock.Advance(time.Millisecond)
	done, _ := b.admit("10.7.7.7")
	done.Negotiated()
	// Full: a new address closes the flood's oldest.
	b.admit("10.6.6.6")
	if !floodConns[0].isClosed() || floodSlots[0].ClosedBy() != Evicted || floodSlots[0].Negotiated() {
		t.Fatal("the flood's oldest handshake was not closed for the newcomer")
	}
	floodSlots[0].Release() // its owner sees the failure and gives the slot back: nothing more
	if floodConns[1].isClosed() {
		t.Fatal("more than one handshake was closed for one newcomer")
	}
	// The flood itself gets nothing by closing its own.
	b.refuse("10.9.9.9", PortFull)
	// 10.6.6.6 holds one, the flood 3: it may close another of the flood's.
	b.admit("10.6.6.6")
	if !floodConns[1].isClosed() {
		t.Fatal("the flood's next oldest was not closed")
	}
	// The flood holds 2 now, 10.6.6.6 two: it is refused rather than take
	// the flood's place (the flood would then hold less than it).
	b.refuse("10.6.6.6", PortFull)
	// A node of the cluster takes a stranger's place all the same: the
	// flood's (two, the most), then 10.6.6.6's (two, older than the
	// flood's last), never the finished connection.
	b.admit("10.0.0.1")
	if !floodConns[2].isClosed() {
		t.Fatal("a known address did not get the flood's oldest handshake")
	}
	st := b.l.Stats()
	if st.Count(Evicted) != 3 || st.Open != 6 || other.ClosedBy() != 0 || done.ClosedBy() != 0 {
		t.Fatalf("stats %+v; the other address's slot closed by %v, the finished one's by %v", st, other.ClosedBy(), done.ClosedBy())
	}
}

// TestAHandshakeHasADeadlineThatShortensUnderPressure: a handshake must
// end by HandshakeTimeout; once half the strangers' handshakes are in
// progress, a stranger's new one gets PressureTimeout, and the next
// connection closes the strangers' handshakes older than that (a known
// address's keeps its HandshakeTimeout); every handshake past
// HandshakeTimeout is closed at the next connection.
func TestAHandshakeHasADeadlineThatShortensUnderPressure(t *testing.T) {
	b := newBench(t, Config{MaxOpen: 20, StrangerHandshakes: 8, PerSourceHandshakes: 8, PerSourceOpen: 8,
		HandshakeTimeout: 5 * time.Second, PressureTimeout: time.Second,
		Known: NewKnown(netip.MustParseAddr("10.0.0.1"))})
	t0 := b.clock.Now()
	calm, calmConn := b.admit("10.1.0.1")
	if want := t0.Add(5 * time.Second); !calm.Deadline().Equal(want) {
		t.Fatalf("deadline %v, want %v", calm.Deadline(), want)
	}
	node, nodeConn := b.admit("10.0.0.1")
	var conns []*fakeConn
	for range 3 {
		_, c := b.admit("10.1.0.2")
		conns = append(conns, c)
	}
	// 4 strangers' handshakes of 8: under pressure.
	busy, _ := b.admit("10.1.0.3")
	if want := t0.Add(time.Second); !busy.Deadline().Equal(want) {
		t.Fatalf("deadline under pressure %v, want %v", busy.Deadline(), want)
	}
	if nodeLate, _ := b.admit("10.0.0.1"); !nodeLate.Deadline().Equal(t0.Add(5 * time.Second)) {
		t.Fatalf("a node's deadline under pressure %v, want the whole %v", nodeLate.Deadline(), 5*time.Second)
	}
	b.clock.Advance(time.Second)
	b.admit("10.1.0.4") // the next connection sweeps
	if !calmConn.isClosed() || calm.ClosedBy() != SlowHandshake || !conns[2].isClosed() {
		t.Fatal("strangers' handshakes older than PressureTimeout were not closed under pressure")
	}
	if nodeConn.isClosed() {
		t.Fatal("a node's handshake was closed before its HandshakeTimeout")
	}
	b.clock.Advance(4 * time.Second)
	b.admit("10.1.0.5")
	if !nodeConn.isClosed() || node.ClosedBy() != SlowHandshake {
		t.Fatal("a node's handshake past HandshakeTimeout was not closed")
	}
	if st := b.l.Stats(); st.Count(SlowHandshake) != 7 || st.Open != 2 {
		t.Fatalf("stats %+v: want 7 slow handshakes closed, and the 2 youngest left (no pressure now)", st)
	}
	// An owner that closes a handshake at its deadline, before any sweep,
	// counts it as slow too; one that closes it sooner (a client that went
	// away) does not.
	early, _ := b.admit("10.1.0.6")
	early.Release()
	late, _ := b.admit("10.1.0.7")
	b.clock.Advance(5 * time.Second)
	late.Release()
	if st := b.l.Stats(); st.Count(SlowHandshake) != 8 || st.Open != 2 {
		t.Fatalf("stats %+v: want the handshake released at its deadline counted slow, the one released sooner not", st)
	}
}

// TestRefusalsAreLoggedALinePerAddressAndInterval: the first refusal of
// an address is logged at once; the rest of its flood a line per
// interval, with the counts; each address has its lines; beyond
// maxLoggedSources addresses, one line speaks for the others.
func TestRefusalsAreLoggedALinePerAddressAndInterval(t *testing.T) {
	b := newBench(t, Config{Port: "nbd", MaxOpen: 1000, StrangerOpen: 1000, PerSourceOpen: 1, PerSourceHandshakes: 1, LogInterval: 10 * time.Second})
	first, _ := b.admit("10.2.0.1")
	first.Negotiated()
	for range 100 {
		b.refuse("10.2.0.1", SourceOpen)
	}
	second, _ := b.admit("10.2.0.2")
	second.Negotiated()
	b.refuse("10.2.0.2", SourceOpen)
	if n := strings.Count(b.log.String(), "\n"); n != 2 {
		t.Fatalf("%d lines for two flooding addresses in one interval, want 2:\n%s", n, b.log)
	}
	b.clock.Advance(10 * time.Second)
	b.refuse("10.2.0.1", SourceOpen)
	lines := strings.Split(strings.TrimSpace(b.log.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[2], "from 10.2.0.1, refused 100 new connection(s)") ||
		!strings.Contains(lines[2], "1 connections from that address are open, the most one address may hold") {
		t.Fatalf("the next interval's line does not count the 99 refused meanwhile and this one:\n%s", b.log)
	}
	b.log.Reset()
	for i := range 2 * maxLoggedSources {
		ip := netip.AddrFrom4([4]byte{10, 3, byte(i >> 8), byte(i)}).String()
		s, _ := b.admit(ip)
		s.Negotiated()
		b.refuse(ip, SourceOpen)
		b.refuse(ip, SourceOpen)
	}
	// 10.2.0.1 is remembered still (its interval runs), 10.2.0.2 not:
	// maxLoggedSources-1 new addresses have lines of their own.
	if n := strings.Count(b.log.String(), "\n"); n != maxLoggedSources || !strings.Contains(b.log.String(), "more than 64 addresses") {
		t.Fatalf("%d lines for %d addresses, want one per address up to %d and one for the others:\n%s", n, 2*maxLoggedSources, maxLoggedSources-1, b.log)
	}
}

// TestSourcesAreAddressesAndIPv6Sites: IPv4 addresses are sources apart
// (a mapped one is its IPv4 address), IPv6 ones count by /64, and a
// connection without an IP address is local (and known).
func TestSourcesAreAddressesAndIPv6Sites(t *testing.T) {
	src := func(a string) string {
		s, _ := SourceOf(net.TCPAddrFromAddrPort(netip.MustParseAddrPort(a)))
		return s.String()
	}
	for _, tc := range []struct{ addr, want string }{
		{"10.0.0.1:1", "10.0.0.1"},
		{"[::ffff:10.0.0.1]:1", "10.0.0.1"},
		{"[2001:db8:1:2:3:4:5:6]:1", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ff::1]:1", "2001:db8:1:2::/64"},
	} {
		if got := src(tc.addr); got != tc.want {
			t.Errorf("source of %s: %s, want %s", tc.addr, got, tc.want)
		}
	}
	if s, _ := SourceOf(&net.UnixAddr{Name: "@", Net: "unix"}); !s.IsLocal() {
		t.Errorf("a unix socket's source is %s, want local", s)
	}
	b := newBench(t, Config{MaxOpen: 10, PerSourceOpen: 1, PerSourceHandshakes: 1})
	b.admit("2001:db8:1:2::1")
	b.refuse("2001:db8:1:2::2", SourceOpen)
	b.admit("2001:db8:1:3::1")
}

// TestABadConfigIsRefused names what is wrong.
func TestABadConfigIsRefused(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "MaxOpen 0"},
		{Config{MaxOpen: 4, MaxHandshakes: 5}, "MaxHandshakes 5 exceeds MaxOpen 4"},
		{Config{MaxOpen: 4, PerSourceOpen: 5}, "PerSourceOpen 5"},
		{Config{MaxOpen: 4, HandshakeTimeout: time.Second, PressureTimeout: 2 * time.Second}, "PressureTimeout 2s"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
