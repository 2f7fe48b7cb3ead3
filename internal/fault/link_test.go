package fault

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// pair is a TCP connection over loopback whose server side is wrapped by
// l.
func pair(t *testing.T, l *Link) (net.Conn, net.Conn) {
	t.Helper()
	inner := mustListen(t)
	ln := l.Listen(inner)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	client, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server := <-accepted
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestPartitionHoldsBothWaysUntilHeal: while the link is cut nothing gets
// through either way (a reader meets its deadline); after the heal what
// was sent arrives, in order.
func TestPartitionHoldsBothWaysUntilHeal(t *testing.T) {
	l := NewLink()
	client, server := pair(t, l)
	l.Partition()
	if _, err := client.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	server.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := server.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read across a partition = %v, want the deadline", err)
	}
	server.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := server.Write([]byte("pong")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write across a partition = %v, want the deadline", err)
	}
	wrote := make(chan error, 1)
	server.SetDeadline(time.Time{})
	go func() {
		_, err := server.Write([]byte("late"))
		wrote <- err
	}()
	l.Heal()
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "late" {
		t.Fatalf("client read %q, %v after the heal", buf, err)
	}
	if _, err := io.ReadFull(server, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("server read %q, %v after the heal", buf, err)
	}
}

// TestDropClosesTheOpenConnections: a drop resets what is open; the peer
// sees the end of the stream, and a held call returns.
func TestDropClosesTheOpenConnections(t *testing.T) {
	l := NewLink()
	client, server := pair(t, l)
	l.Partition()
	held := make(chan error, 1)
	go func() {
		_, err := server.Write([]byte("x"))
		held <- err
	}()
	if n := l.Drop(); n != 1 || l.Open() != 0 || l.Dropped() != 1 {
		t.Fatalf("Drop closed %d, %d open, %d dropped", n, l.Open(), l.Dropped())
	}
	if err := <-held; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("held write after a drop = %v", err)
	}
	if _, err := client.Read(make([]byte, 1)); err == nil {
		t.Fatal("the client read from a dropped connection")
	}
}

// TestDelaySlowsEveryWrite: each write waits the link's delay.
func TestDelaySlowsEveryWrite(t *testing.T) {
	l := NewLink()
	client, server := pair(t, l)
	l.SetDelay(20 * time.Millisecond)
	start := time.Now()
	for range 3 {
		if _, err := server.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took < 60*time.Millisecond {
		t.Fatalf("3 writes with a 20ms delay took %s", took)
	}
	if _, err := io.ReadFull(client, make([]byte, 3)); err != nil {
		t.Fatal(err)
	}
}

// TestCutResetsAndRefusesUntilHeal: a cut closes what is open and every
// connection accepted until the heal; then connections work again.
func TestCutResetsAndRefusesUntilHeal(t *testing.T) {
	l := NewLink()
	client, _ := pair(t, l)
	ln := l.Listen(mustListen(t))
	l.Cut()
	if !l.Partitioned() || l.Open() != 0 {
		t.Fatalf("after a cut: partitioned %v, %d open", l.Partitioned(), l.Open())
	}
	if _, err := client.Read(make([]byte, 1)); err == nil {
		t.Fatal("the client read from a cut connection")
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	refused, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer refused.Close()
	if _, err := refused.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection made across a cut was served")
	}
	l.Heal()
	served, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer served.Close()
	c := <-accepted
	defer c.Close()
	if l.Open() != 1 {
		t.Fatalf("%d open after the heal, want 1", l.Open())
	}
}

func mustListen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}
