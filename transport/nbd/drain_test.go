package nbd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/replvol/replvol/transport/nbd"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

// The drain of a connection (Shutdown, CloseExport) at its worst moments. Its promise: every
// request the server has read from the socket is answered (carried out, or NBD_ESHUTDOWN and
// not carried out), and then the server ends the connection in order, so that the client
// reads every reply and then the end of the connection (EOF). A request the client sends
// after the server's last read is not carried out, and the client sees that end, never
// "connection reset": a reset also throws away the replies the server had not sent yet.
//
// The drain's quiet time is shortened to nothing, so that the reader gives up as soon as no
// request is in sight; what happens around it is held by gates and budget, not by time.

// drainCase is a transport the drain runs over.
type drainCase struct {
	name string
	tls  bool
}

var drainCases = []drainCase{{"plaintext", false}, {"TLS", true}}

// startDrainServer serves export as "vol" (over TLS for tc.tls) with a drain whose quiet time
// is nothing; readerStopped, if set, is called as a draining reader stops.
func startDrainServer(t *testing.T, tc drainCase, export nbd.Export, readerStopped func(), configure ...func(*nbd.Config)) *testServer {
	t.Helper()
	var p *testPKI
	if tc.tls {
		p = newTestPKI(t)
		configure = append(configure, func(c *nbd.Config) { c.TLS = p.server })
	}
	s := startServer(t, map[string]nbd.Export{"vol": export}, configure...)
	if p != nil {
		s.clientTLS = p.client
	}
	nbd.SetDrainTiming(s.Server, time.Nanosecond, time.Minute, time.Minute, readerStopped)
	return s
}

// shutdownInBackground starts s.Shutdown and waits until the connection drains; the result
// comes on the channel.
func shutdownInBackground(t *testing.T, s *testServer) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	waitUntil(t, "the connection draining", func() (bool, string) {
		n := s.Stats().DrainingConnections
		return n == 1, fmt.Sprint(n, " draining")
	})
	return done
}

// receiveAll reads n replies by handle; any failure is a request left without its reply.
func receiveAll(t *testing.T, c *nbdtest.Client, n int) map[uint64]nbdtest.Reply {
	t.Helper()
	replies := map[uint64]nbdtest.Reply{}
	for range n {
		rep, err := c.Receive()
		if err != nil {
			t.Fatalf("a request the server read got no reply (%d of %d answered): %v", len(replies), n, err)
		}
		replies[rep.Handle] = rep
	}
	return replies
}

// wantOrderlyEnd checks that the server ends the connection with an EOF, and that Shutdown
// returns once the client closes too.
func wantOrderlyEnd(t *testing.T, c *nbdtest.Client, shutdown <-chan error) {
	t.Helper()
	if err := c.WaitClosed(); err != nil {
		t.Fatalf("the end of the connection: %v, want EOF (an orderly close)", err)
	}
	c.Close()
	if err := <-shutdown; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

func send(t *testing.T, c *nbdtest.Client, req nbdtest.Request) uint64 {
	t.Helper()
	h, err := c.Send(req)
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	return h
}

func write4(off uint64, data string) nbdtest.Request {
	return nbdtest.Request{Type: nbdtest.CmdWrite, Offset: off, Length: uint32(len(data)), Payload: []byte(data)}
}

// TestADrainAnswersARequestItsReaderCameLateFor: a request is in the socket when the drain
// begins, but the reader is busy (handing the request before it to the one worker, which a
// slow write holds) until the drain's quiet time has passed. The reader must still read it and
// answer it NBD_ESHUTDOWN, not close the connection with it unread (which resets the
// connection: the client saw "connection reset by peer" under a loaded machine, where readers
// come late).
func TestADrainAnswersARequestItsReaderCameLateFor(t *testing.T) {
	for _, tc := range drainCases {
		t.Run(tc.name, func(t *testing.T) {
			mem := nbdtest.NewMemExport(1 << 20)
			gate := nbdtest.NewGate(nbdtest.OpWrite)
			s := startDrainServer(t, tc, &nbdtest.FaultyExport{Device: mem, Injector: gate}, nil,
				func(c *nbd.Config) { c.MaxInFlight = 1 })
			t.Cleanup(gate.Open)
			c := s.dial(t, "vol")
			first := send(t, c, write4(0, "one!"))
			<-gate.Entered // the one worker holds it
			second := send(t, c, write4(4096, "two!"))
			waitUntil(t, "the reader has the second write", func() (bool, string) {
				n := s.Stats().Requests.Write
				return n == 2, fmt.Sprint(n, " writes read")
			})
			// The reader waits to hand the second write over and reads nothing: the third
			// stays in the socket.
			late := send(t, c, write4(8192, "late"))
			shutdown := shutdownInBackground(t, s)
			gate.Open()
			replies := receiveAll(t, c, 3)
			for _, h := range []uint64{first, second} {
				if rep := replies[h]; rep.Errno != 0 {
					t.Errorf("a write read before the drain: errno %d", rep.Errno)
				}
			}
			if rep := replies[late]; rep.Errno != 108 {
				t.Errorf("the write read during the drain: errno %d, want 108 (NBD_ESHUTDOWN)", rep.Errno)
			}
			if got := string(mem.Bytes(8192, 4)); got == "late" {
				t.Error("the write answered NBD_ESHUTDOWN was carried out")
			}
			if string(mem.Bytes(0, 4)) != "one!" || string(mem.Bytes(4096, 4)) != "two!" {
				t.Error("a write answered OK is not in the export")
			}
			wantOrderlyEnd(t, c, shutdown)
		})
	}
}

// TestADrainAnswersARequestWaitingForBudget: a write's header is read, and it waits for the
// node's budget (a held READ holds all of it) when the drain begins. No Export call has seen
// it, but the server read it: it must be answered (NBD_ESHUTDOWN and not carried out, or
// carried out), its payload read, and the held READ's data must reach the client whole.
func TestADrainAnswersARequestWaitingForBudget(t *testing.T) {
	for _, tc := range drainCases {
		t.Run(tc.name, func(t *testing.T) {
			const writeLength = 2 << 20 // beyond the connection's reserve: it needs the node budget
			mem := nbdtest.NewMemExport(nbd.MaxRequestLength + writeLength)
			mem.Fill(0, nbd.MaxRequestLength, 0x5a)
			gate := nbdtest.NewGate(nbdtest.OpRead)
			s := startDrainServer(t, tc, &nbdtest.FaultyExport{Device: mem, Injector: gate}, nil,
				func(c *nbd.Config) { c.NodeBudget = nbd.MaxRequestLength })
			t.Cleanup(gate.Open)
			c := s.dial(t, "vol")
			read := send(t, c, nbdtest.Request{Type: nbdtest.CmdRead, Offset: 0, Length: nbd.MaxRequestLength})
			<-gate.Entered
			payload := pattern(writeLength, 3)
			write := send(t, c, nbdtest.Request{Type: nbdtest.CmdWrite, Offset: nbd.MaxRequestLength, Length: writeLength, Payload: payload})
			waitUntil(t, "the write waiting for budget", func() (bool, string) {
				n := s.Stats().WaitingRequests
				return n == 1, fmt.Sprint(n, " waiting")
			})
			shutdown := shutdownInBackground(t, s)
			gate.Open()
			replies := receiveAll(t, c, 2)
			if rep := replies[read]; rep.Errno != 0 || len(rep.Data) != nbd.MaxRequestLength || rep.Data[len(rep.Data)-1] != 0x5a {
				t.Errorf("the READ read before the drain: errno %d, %d bytes", rep.Errno, len(rep.Data))
			}
			landed := bytes.Equal(mem.Bytes(nbd.MaxRequestLength, writeLength), payload)
			switch rep := replies[write]; {
			case rep.Errno == 108 && landed:
				t.Error("the write answered NBD_ESHUTDOWN was carried out")
			case rep.Errno == 0 && !landed:
				t.Error("the write answered OK is not in the export")
			case rep.Errno != 0 && rep.Errno != 108:
				t.Errorf("the write waiting for budget: errno %d, want 0 or 108 (NBD_ESHUTDOWN)", rep.Errno)
			}
			wantOrderlyEnd(t, c, shutdown)
		})
	}
}

// TestADrainEndsInOrderWhenARequestCrossesTheClose: the reader has stopped (the client was
// quiet) and a READ in flight is still being carried out when the client sends a write. The
// server never reads that write as a request: it answers the READ and then ends the connection
// in order. The client gets the READ's data whole, then EOF for the write that crossed the
// close, which was not carried out. Closing with the write unread would reset the connection:
// the client would read "connection reset", and lose the part of the READ's data the server's
// kernel had not sent yet.
func TestADrainEndsInOrderWhenARequestCrossesTheClose(t *testing.T) {
	for _, tc := range drainCases {
		t.Run(tc.name, func(t *testing.T) {
			const readLength = 8 << 20 // more than the socket buffers hold
			mem := nbdtest.NewMemExport(readLength + 1<<20)
			mem.Fill(0, readLength, 0x5a)
			gate := nbdtest.NewGate(nbdtest.OpRead)
			stopped := make(chan struct{}, 1)
			s := startDrainServer(t, tc, &nbdtest.FaultyExport{Device: mem, Injector: gate}, func() {
				select {
				case stopped <- struct{}{}:
				default:
				}
			})
			t.Cleanup(gate.Open)
			c := s.dial(t, "vol")
			read := send(t, c, nbdtest.Request{Type: nbdtest.CmdRead, Offset: 0, Length: readLength})
			<-gate.Entered
			shutdown := shutdownInBackground(t, s)
			<-stopped
			send(t, c, write4(readLength, "late"))
			gate.Open()
			rep, err := c.Receive()
			if err != nil || rep.Handle != read || rep.Errno != 0 || len(rep.Data) != readLength || rep.Data[readLength-1] != 0x5a {
				t.Fatalf("the READ in flight as the reader stopped: errno %d, %d bytes, %v; want its data whole", rep.Errno, len(rep.Data), err)
			}
			if _, err := c.Receive(); !errors.Is(err, io.EOF) {
				t.Fatalf("the write that crossed the close: %v, want EOF (an orderly end)", err)
			}
			if string(mem.Bytes(readLength, 4)) == "late" {
				t.Error("the write the server never read was carried out")
			}
			c.Close()
			if err := <-shutdown; err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
		})
	}
}
