package nbd_test

// These tests pin the transmission phase: each command reaches the Export with the right range
// and flags; every bad request is answered with the right errno, never reaches the Export, and
// leaves the connection usable; replies may overtake each other; DISC, Shutdown and CloseExport
// answer what is in flight before closing.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/transport/nbd"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

func TestCommandsReachTheExport(t *testing.T) {
	mem := nbdtest.NewMemExport(testExportSize)
	s := startServer(t, map[string]nbd.Export{"vol": mem})
	c := s.dial(t, "vol")

	data := pattern(3000, 0xab)
	if err := c.Write(1000, data, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mem.Bytes(1000, 3000), data) {
		t.Fatal("unaligned write did not land at offset 1000")
	}
	if got, err := c.Read(999, 3002); err != nil || !bytes.Equal(got[1:3001], data) || got[0] != 0 || got[3001] != 0 {
		t.Fatalf("read around the write: %v", err)
	}
	if err := c.Write(testExportSize-4096, pattern(4096, 1), nbdtest.CmdFlagFUA); err != nil {
		t.Fatal("FUA write of the last block:", err)
	}
	if mem.FUACalls() != 1 {
		t.Errorf("FUA calls %d, want 1 (the FUA flag must reach WriteAt)", mem.FUACalls())
	}
	if err := c.Flush(); err != nil || mem.Calls(nbdtest.OpFlush) != 1 {
		t.Fatalf("flush: %v, %d Flush calls", err, mem.Calls(nbdtest.OpFlush))
	}

	if err := c.WriteZeroes(1500, 100, nbdtest.CmdFlagNoHole|nbdtest.CmdFlagFUA); err != nil {
		t.Fatal("write zeroes with NO_HOLE|FUA:", err)
	}
	if !bytes.Equal(mem.Bytes(1500, 100), make([]byte, 100)) || mem.FUACalls() != 2 {
		t.Fatal("write zeroes did not zero [1500, 1600) with FUA")
	}
	if err := c.Trim(2000, 500, 0); err != nil || !bytes.Equal(mem.Bytes(2000, 500), make([]byte, 500)) {
		t.Fatalf("trim: %v", err)
	}
	// TRIM has no fua parameter in Export: FUA on TRIM is a Trim followed by a Flush.
	if err := c.Trim(0, 4096, nbdtest.CmdFlagFUA); err != nil || mem.Calls(nbdtest.OpFlush) != 2 {
		t.Fatalf("trim FUA: %v, %d Flush calls, want 2", err, mem.Calls(nbdtest.OpFlush))
	}
	// FUA is accepted (and ignored) on READ and FLUSH, as proto.md requires once SEND_FUA is set.
	if _, err := c.Do(nbdtest.Request{Type: nbdtest.CmdRead, Flags: nbdtest.CmdFlagFUA, Length: 1}); err != nil {
		t.Fatal("read with FUA:", err)
	}
	if _, err := c.Do(nbdtest.Request{Type: nbdtest.CmdFlush, Flags: nbdtest.CmdFlagFUA}); err != nil {
		t.Fatal("flush with FUA:", err)
	}
	if _, err := c.Read(0, 32<<20); err == nil {
		t.Fatal("read of 32 MiB from a 16 MiB export succeeded")
	}
	if _, err := c.Disconnect(); err != nil {
		t.Fatal(err)
	}
}

func TestMaximumLengthRequestsSucceed(t *testing.T) {
	mem := nbdtest.NewMemExport(40 << 20)
	s := startServer(t, map[string]nbd.Export{"vol": mem})
	c := s.dial(t, "vol")
	data := pattern(32<<20, 3)
	if err := c.Write(1, data, 0); err != nil {
		t.Fatal("32 MiB write:", err)
	}
	got, err := c.Read(1, 32<<20)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("32 MiB read: %v", err)
	}
	// TRIM and WRITE_ZEROES carry no payload, so the 32 MiB limit does not apply to them.
	if err := c.WriteZeroes(0, 40<<20, 0); err != nil {
		t.Fatal("40 MiB write zeroes:", err)
	}
}

func TestBadRequestsAreAnsweredAndKeepTheConnection(t *testing.T) {
	const size = testExportSize
	for _, tc := range []struct {
		name string
		req  nbdtest.Request
		want nbdtest.Errno
	}{
		{"read past the end", nbdtest.Request{Type: nbdtest.CmdRead, Offset: size - 4096, Length: 8192}, nbdtest.EINVAL},
		{"read starting past the end", nbdtest.Request{Type: nbdtest.CmdRead, Offset: size + 1, Length: 1}, nbdtest.EINVAL},
		{"read whose offset+length overflows", nbdtest.Request{Type: nbdtest.CmdRead, Offset: math.MaxUint64, Length: 2}, nbdtest.EINVAL},
		{"write past the end", nbdtest.Request{Type: nbdtest.CmdWrite, Offset: size - 1, Length: 2, Payload: []byte("xy")}, nbdtest.ENOSPC},
		{"write whose offset+length overflows", nbdtest.Request{Type: nbdtest.CmdWrite, Offset: math.MaxUint64 - 1, Length: 4, Payload: []byte("wxyz")}, nbdtest.ENOSPC},
		{"trim past the end", nbdtest.Request{Type: nbdtest.CmdTrim, Offset: size, Length: 1}, nbdtest.EINVAL},
		{"write zeroes past the end", nbdtest.Request{Type: nbdtest.CmdWriteZeroes, Offset: 1, Length: size}, nbdtest.ENOSPC},
		{"zero-length read", nbdtest.Request{Type: nbdtest.CmdRead, Offset: 0}, nbdtest.EINVAL},
		{"zero-length write", nbdtest.Request{Type: nbdtest.CmdWrite, Offset: 0}, nbdtest.EINVAL},
		{"zero-length trim", nbdtest.Request{Type: nbdtest.CmdTrim, Offset: 0}, nbdtest.EINVAL},
		{"zero-length write zeroes", nbdtest.Request{Type: nbdtest.CmdWriteZeroes, Offset: 0}, nbdtest.EINVAL},
		{"read over 32 MiB", nbdtest.Request{Type: nbdtest.CmdRead, Length: 32<<20 + 1}, nbdtest.EINVAL},
		{"write over 32 MiB, payload sent", nbdtest.Request{Type: nbdtest.CmdWrite, Length: 33 << 20, Payload: pattern(33<<20, 9)}, nbdtest.EINVAL},
		{"unknown command 99 with a length (no payload follows)", nbdtest.Request{Type: 99, Length: 4096}, nbdtest.EINVAL},
		{"NBD_CMD_CACHE (not advertised)", nbdtest.Request{Type: nbdtest.CmdCache, Length: 4096}, nbdtest.EINVAL},
		{"NBD_CMD_BLOCK_STATUS (not negotiated)", nbdtest.Request{Type: nbdtest.CmdBlockStatus, Length: 4096}, nbdtest.EINVAL},
		{"read with DF (no structured replies)", nbdtest.Request{Type: nbdtest.CmdRead, Flags: nbdtest.CmdFlagDF, Length: 512}, nbdtest.EINVAL},
		{"write with NO_HOLE (not a write flag), payload sent", nbdtest.Request{Type: nbdtest.CmdWrite, Flags: nbdtest.CmdFlagNoHole, Length: 3, Payload: []byte("abc")}, nbdtest.EINVAL},
		{"write zeroes with FAST_ZERO (not advertised)", nbdtest.Request{Type: nbdtest.CmdWriteZeroes, Flags: nbdtest.CmdFlagFastZero, Length: 512}, nbdtest.EINVAL},
		{"trim with an unknown flag bit 15", nbdtest.Request{Type: nbdtest.CmdTrim, Flags: 1 << 15, Length: 512}, nbdtest.EINVAL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := nbdtest.NewMemExport(size)
			mem.Fill(0, 16, 0x5a)
			s := startServer(t, map[string]nbd.Export{"vol": mem})
			c := s.dial(t, "vol")
			_, err := c.Do(tc.req)
			wantErrno(t, err, tc.want)
			// The same connection still works, so the stream stayed in sync.
			got, err := c.Read(0, 16)
			if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{0x5a}, 16)) {
				t.Fatalf("read after the bad request: %q %v", got, err)
			}
			for op := nbdtest.OpWrite; op <= nbdtest.OpFlush; op++ {
				if n := mem.Calls(op); n != 0 {
					t.Errorf("the bad request reached the Export: %d %v calls", n, op)
				}
			}
			if n := mem.Calls(nbdtest.OpRead); n != 1 {
				t.Errorf("%d ReadAt calls, want only the check read", n)
			}
			if errs := s.Stats().Errors; errs.Read+errs.Write+errs.Trim+errs.WriteZeroes+errs.Other != 1 {
				t.Errorf("error counters %+v, want exactly one error", errs)
			}
		})
	}
}

func TestBadRequestMagicCloses(t *testing.T) {
	s := startServer(t, nil)
	c := s.dial(t, "vol")
	if err := c.SendRaw(make([]byte, 28)); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitClosed(); err != nil {
		t.Fatalf("after a request with magic 0: %v, want the connection closed", err)
	}
}

func TestExportErrorsMapToNBDErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want nbdtest.Errno
	}{
		{"ENOSPC", fmt.Errorf("volume full: %w", syscall.ENOSPC), nbdtest.ENOSPC},
		{"EROFS from a Secondary", fmt.Errorf("vol0 is Secondary: %w", syscall.EROFS), nbdtest.EPERM},
		{"EPERM", syscall.EPERM, nbdtest.EPERM},
		{"EINVAL", syscall.EINVAL, nbdtest.EINVAL},
		{"ESHUTDOWN", syscall.ESHUTDOWN, nbdtest.ESHUTDOWN},
		{"EDQUOT becomes ENOSPC", syscall.EDQUOT, nbdtest.ENOSPC},
		{"a plain error becomes EIO", errors.New("disk on fire"), nbdtest.EIO},
		{"an unlisted errno becomes EIO", syscall.ENOENT, nbdtest.EIO},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := nbdtest.NewMemExport(1 << 20)
			ops := []nbdtest.Op{nbdtest.OpRead, nbdtest.OpWrite, nbdtest.OpWriteZeroes, nbdtest.OpTrim, nbdtest.OpFlush}
			faulty := &nbdtest.FaultyExport{Device: mem, Injector: nbdtest.FailOn(tc.err, ops...)}
			s := startServer(t, map[string]nbd.Export{"vol": faulty})
			c := s.dial(t, "vol")
			_, err := c.Read(0, 4096) // a failed READ must send no data after its header
			wantErrno(t, err, tc.want)
			wantErrno(t, c.Write(0, []byte("data"), 0), tc.want)
			wantErrno(t, c.WriteZeroes(0, 10, 0), tc.want)
			wantErrno(t, c.Trim(0, 10, 0), tc.want)
			wantErrno(t, c.Flush(), tc.want)
			if errs := s.Stats().Errors; errs.Read != 1 || errs.Write != 1 || errs.Flush != 1 || errs.Trim != 1 || errs.WriteZeroes != 1 {
				t.Errorf("error counters %+v", errs)
			}
		})
	}
}

func TestReadOnlyExportRefusesWrites(t *testing.T) {
	mem := nbdtest.NewMemExport(1 << 20)
	s := startServer(t, map[string]nbd.Export{"vol": readOnlyExport{mem}})
	c := s.dial(t, "vol")
	if c.Info.Flags&nbdtest.FlagReadOnly == 0 {
		t.Fatalf("flags %#x lack READ_ONLY", c.Info.Flags)
	}
	wantErrno(t, c.Write(0, []byte("x"), 0), nbdtest.EPERM)
	wantErrno(t, c.Trim(0, 1, 0), nbdtest.EPERM)
	wantErrno(t, c.WriteZeroes(0, 1, 0), nbdtest.EPERM)
	if _, err := c.Read(0, 1); err != nil {
		t.Fatal(err)
	}
	if mem.Calls(nbdtest.OpWrite)+mem.Calls(nbdtest.OpTrim)+mem.Calls(nbdtest.OpWriteZeroes) != 0 {
		t.Fatal("a write reached a read-only export")
	}
}

type readOnlyExport struct{ *nbdtest.MemExport }

func (readOnlyExport) ReadOnly() bool { return true }

func TestPipelinedRequestsAreAllAnswered(t *testing.T) {
	mem := nbdtest.NewMemExport(testExportSize)
	s := startServer(t, map[string]nbd.Export{"vol": mem})
	c := s.dial(t, "vol")
	const n = 500
	// Handles are assigned in order from 1: write i is 2i+1, read i is 2i+2. Fill before
	// sending, so each read has known data to return.
	for i := range n {
		mem.Fill(int64(i)*8192+4096, 4096, byte(i))
	}
	sent := make(chan error, 1)
	go func() { // send everything without waiting, while the replies are read below
		for i := range n {
			off := uint64(i) * 8192
			if _, err := c.Send(nbdtest.Request{Type: nbdtest.CmdWrite, Offset: off, Length: 4096, Payload: pattern(4096, byte(i))}); err != nil {
				sent <- err
				return
			}
			if _, err := c.Send(nbdtest.Request{Type: nbdtest.CmdRead, Offset: off + 4096, Length: 4096}); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	answered := make(map[uint64]bool)
	for range 2 * n {
		rep, err := c.Receive()
		if err != nil {
			t.Fatal(err)
		}
		if rep.Errno != 0 || answered[rep.Handle] {
			t.Fatalf("handle %d: %v (answered twice: %v)", rep.Handle, rep.Errno, answered[rep.Handle])
		}
		answered[rep.Handle] = true
		if rep.Handle%2 == 0 && !bytes.Equal(rep.Data, bytes.Repeat([]byte{byte(rep.Handle/2 - 1)}, 4096)) {
			t.Fatalf("read handle %d: wrong data", rep.Handle)
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if !bytes.Equal(mem.Bytes(int64(i)*8192, 4096), pattern(4096, byte(i))) {
			t.Fatalf("write %d lost", i)
		}
	}
	if st := s.Stats(); st.Requests.Write != n || st.Requests.Read != n || st.BytesWritten != n*4096 || st.BytesRead != n*4096 {
		t.Errorf("stats %+v", st)
	}
}

func TestSlowRequestDoesNotHoldUpLaterOnes(t *testing.T) {
	mem := nbdtest.NewMemExport(1 << 20)
	gate := nbdtest.NewGate(nbdtest.OpRead)
	s := startServer(t, map[string]nbd.Export{"vol": &nbdtest.FaultyExport{Device: mem, Injector: gate}})
	c := s.dial(t, "vol")
	slow, err := c.Send(nbdtest.Request{Type: nbdtest.CmdRead, Length: 512})
	if err != nil {
		t.Fatal(err)
	}
	<-gate.Entered
	fast, err := c.Send(nbdtest.Request{Type: nbdtest.CmdWrite, Offset: 4096, Length: 1, Payload: []byte{1}})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := c.Receive(); err != nil || rep.Handle != fast {
		t.Fatalf("first reply %+v %v, want the write (handle %d) while the read is held", rep, err, fast)
	}
	gate.Open()
	if rep, err := c.Receive(); err != nil || rep.Handle != slow || len(rep.Data) != 512 {
		t.Fatalf("second reply %+v %v, want the read (handle %d)", rep, err, slow)
	}
}

func TestMaxInFlightBoundsConcurrentExportCalls(t *testing.T) {
	mem := nbdtest.NewMemExport(1 << 20)
	gate := nbdtest.NewGate(nbdtest.OpWrite)
	var active, peak atomic.Int64
	injector := nbdtest.InjectorFunc(func(ctx context.Context, op nbdtest.Op, off, length int64) error {
		n := active.Add(1)
		defer active.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		return gate.Inject(ctx, op, off, length)
	})
	s := startServer(t, map[string]nbd.Export{"vol": &nbdtest.FaultyExport{Device: mem, Injector: injector}},
		func(c *nbd.Config) { c.MaxInFlight = 2 })
	c := s.dial(t, "vol")
	for i := range 6 {
		if _, err := c.Send(nbdtest.Request{Type: nbdtest.CmdWrite, Offset: uint64(i), Length: 1, Payload: []byte{1}}); err != nil {
			t.Fatal(err)
		}
	}
	<-gate.Entered
	<-gate.Entered
	gate.Open()
	for c.Pending() > 0 {
		if rep, err := c.Receive(); err != nil || rep.Errno != 0 {
			t.Fatalf("%+v %v", rep, err)
		}
	}
	if p := peak.Load(); p != 2 {
		t.Fatalf("peak concurrent Export calls %d, want MaxInFlight=2", p)
	}
}

func TestManyConnections(t *testing.T) {
	mem := nbdtest.NewMemExport(testExportSize)
	s := startServer(t, map[string]nbd.Export{"vol": mem})
	var wg sync.WaitGroup
	for i := range 8 {
		c := s.dial(t, "vol")
		wg.Go(func() {
			for j := range 50 {
				off := uint64(i)<<20 + uint64(j)*4096
				data := pattern(4096, byte(i*50+j))
				if err := c.Write(off, data, 0); err != nil {
					t.Error(err)
					return
				}
				if got, err := c.Read(off, 4096); err != nil || !bytes.Equal(got, data) {
					t.Errorf("conn %d read %d: %v", i, j, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := s.Stats().OpenConnections; n != 8 {
		t.Errorf("OpenConnections %d, want 8", n)
	}
}

func TestDisconnectAnswersOutstandingRequestsFirst(t *testing.T) {
	mem := nbdtest.NewMemExport(1 << 20)
	gate := nbdtest.NewGate(nbdtest.OpWrite)
	s := startServer(t, map[string]nbd.Export{"vol": &nbdtest.FaultyExport{Device: mem, Injector: gate}})
	c := s.dial(t, "vol")
	if _, err := c.Send(nbdtest.Request{Type: nbdtest.CmdWrite, Offset: 7, Length: 5, Payload: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	<-gate.Entered
	if _, err := c.Send(nbdtest.Request{Type: nbdtest.CmdDisc}); err != nil {
		t.Fatal(err)
	}
	gate.Open()
	rep, err := c.Receive()
	if err != nil || rep.Errno != 0 {
		t.Fatalf("write reply after DISC: %+v %v", rep, err)
	}
	if err := c.WaitClosed(); err != nil {
		t.Fatal(err)
	}
	if string(mem.Bytes(7, 5)) != "hello" {
		t.Fatal("write lost")
	}
	if st := s.Stats(); st.Requests.Disconnect != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestShutdownAnswersRequestsInFlight(t *testing.T) {
	mem := nbdtest.NewMemExport(1 << 20)
	gate := nbdtest.NewGate(nbdtest.OpWrite, nbdtest.OpFlush)
	s := startServer(t, map[string]nbd.Export{"vol": &nbdtest.FaultyExport{Device: mem, Injector: gate}})
	c := s.dial(t, "vol")
	write, _ := c.Send(nbdtest.Request{Type: nbdtest.CmdWrite, Offset: 0, Length: 4, Payload: []byte("abcd")})
	flush, _ := c.Send(nbdtest.Request{Type: nbdtest.CmdFlush})
	<-gate.Entered
	<-gate.Entered

	shutdown := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		shutdown <- s.Shutdown(ctx)
	}()
	if err := <-s.served; err != nil { // Serve returns once the listener is closed
		t.Fatalf("Serve: %v", err)
	}
	s.served <- nil // for the cleanup
	select {
	case err := <-shutdown:
		t.Fatalf("Shutdown returned %v with two requests held in the Export", err)
	default:
	}
	gate.Open()
	got := map[uint64]bool{}
	for range 2 {
		rep, err := c.Receive()
		if err != nil || rep.Errno != 0 {
			t.Fatalf("reply during Shutdown: %+v %v", rep, err)
		}
		got[rep.Handle] = true
	}
	if !got[write] || !got[flush] {
		t.Fatalf("replies %v, want handles %d and %d", got, write, flush)
	}
	if err := c.WaitClosed(); err != nil {
		t.Fatal(err)
	}
	if err := <-shutdown; err != nil {
		t.Fatal(err)
	}
	if string(mem.Bytes(0, 4)) != "abcd" {
		t.Fatal("write lost")
	}
}

func TestShutdownDeadlineClosesByForce(t *testing.T) {
	mem := nbdtest.NewMemExport(1 << 20)
	gate := nbdtest.NewGate(nbdtest.OpWrite) // never opened
	s := startServer(t, map[string]nbd.Export{"vol": &nbdtest.FaultyExport{Device: mem, Injector: gate}})
	c := s.dial(t, "vol")
	if _, err := c.Send(nbdtest.Request{Type: nbdtest.CmdWrite, Length: 1, Payload: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	<-gate.Entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown with an expired context: %v, want context.Canceled", err)
	}
	// The Export call saw its context cancelled, and the connection was closed without a reply.
	_, err := c.Receive()
	wantClosed(t, err)
}

func TestCloseExportDrainsOnlyThatExport(t *testing.T) {
	memA, memB := nbdtest.NewMemExport(1<<20), nbdtest.NewMemExport(1<<20)
	gate := nbdtest.NewGate(nbdtest.OpWrite)
	s := startServer(t, map[string]nbd.Export{
		"a": &nbdtest.FaultyExport{Device: memA, Injector: gate},
		"b": memB,
	})
	a, b := s.dial(t, "a"), s.dial(t, "b")
	if _, err := a.Send(nbdtest.Request{Type: nbdtest.CmdWrite, Length: 2, Payload: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	<-gate.Entered
	closed := make(chan struct{})
	go func() {
		s.CloseExport("a")
		close(closed)
	}()
	gate.Open()
	if rep, err := a.Receive(); err != nil || rep.Errno != 0 {
		t.Fatalf("in-flight write on a: %+v %v", rep, err)
	}
	if err := a.WaitClosed(); err != nil {
		t.Fatal(err)
	}
	<-closed
	if err := b.Write(0, []byte("still here"), 0); err != nil {
		t.Fatalf("export b after CloseExport(a): %v", err)
	}
	if string(memA.Bytes(0, 2)) != "hi" {
		t.Fatal("write on a lost")
	}
}

func TestCloseExportDuringLookupRefusesTheHandshake(t *testing.T) {
	s := startServer(t, nil)
	var once sync.Once
	s.resolver.setBeforeLookup(func(name string) {
		// The node stops being primary between this Lookup and the end of the handshake.
		once.Do(func() { s.CloseExport(name) })
	})
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	var oe *nbdtest.OptionError
	if _, _, err := h.Go("vol"); !errors.As(err, &oe) || oe.Type != nbdtest.RepErrUnknown {
		t.Fatalf("GO racing CloseExport: %v, want NBD_REP_ERR_UNKNOWN", err)
	}
	if _, _, err := h.Go("vol"); err != nil {
		t.Fatalf("GO retried after the race: %v", err)
	}
}

func TestStatsCountConnections(t *testing.T) {
	s := startServer(t, nil)
	c := s.dial(t, "vol")
	if _, err := c.Disconnect(); err != nil {
		t.Fatal(err)
	}
	h := s.greet(t, nbdtest.ClientFixedNewstyle)
	if err := h.SendOption(nbdtest.OptAbort, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.ReadReply(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.ReadReply(); !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.AcceptedConnections != 2 || st.FailedHandshakes != 1 || st.OpenConnections != 0 || st.Requests.Disconnect != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestShutdownAnswersEveryRequestOfAClientStillSending: a client writes on
// while the server shuts down. The write received before is carried out
// and answered; the writes that arrive after are answered with
// NBD_ESHUTDOWN and not carried out, so the client knows each one's fate
// and none is cut off mid-request. The connection closes on the client's
// NBD_CMD_DISC, and Shutdown returns.
func TestShutdownAnswersEveryRequestOfAClientStillSending(t *testing.T) {
	t.Run("plaintext", func(t *testing.T) { shutdownAnswersEveryRequestOfAClientStillSending(t, nil) })
	// Over TLS the drain's read deadlines interrupt TLS reads, which go on after them, and the
	// connection ends with close_notify.
	t.Run("TLS", func(t *testing.T) { shutdownAnswersEveryRequestOfAClientStillSending(t, newTestPKI(t)) })
}

func shutdownAnswersEveryRequestOfAClientStillSending(t *testing.T, p *testPKI) {
	mem := nbdtest.NewMemExport(1 << 20)
	gate := nbdtest.NewGate(nbdtest.OpWrite)
	s := startServer(t, map[string]nbd.Export{"vol": &nbdtest.FaultyExport{Device: mem, Injector: gate}}, func(c *nbd.Config) {
		if p != nil {
			c.TLS = p.server
		}
	})
	if p != nil {
		s.clientTLS = p.client
	}
	c := s.dial(t, "vol")
	first, err := c.Send(nbdtest.Request{Type: nbdtest.CmdWrite, Offset: 0, Length: 4, Payload: []byte("abcd")})
	if err != nil {
		t.Fatal(err)
	}
	<-gate.Entered
	shutdown := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		shutdown <- s.Shutdown(ctx)
	}()
	if err := <-s.served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	s.served <- nil // for the cleanup
	waitUntil(t, "the connection draining", func() (bool, string) {
		n := s.Stats().DrainingConnections
		return n == 1, fmt.Sprint(n, " draining")
	})
	later := map[uint64]int64{}
	for i := range int64(5) {
		off := 4096 * (i + 1)
		h, err := c.Send(nbdtest.Request{Type: nbdtest.CmdWrite, Offset: uint64(off), Length: 4, Payload: []byte("late")})
		if err != nil {
			t.Fatalf("write %d after the drain began: %v", i, err)
		}
		later[h] = off
	}
	gate.Open()
	for range 6 {
		rep, err := c.Receive()
		if err != nil {
			t.Fatalf("a request left without a reply: %v", err)
		}
		switch off, late := later[rep.Handle]; {
		case rep.Handle == first && rep.Errno != 0:
			t.Fatalf("the write received before the shutdown: errno %d", rep.Errno)
		case late && rep.Errno != 108:
			t.Fatalf("a write received during the drain: errno %d, want 108 (NBD_ESHUTDOWN)", rep.Errno)
		case late && string(mem.Bytes(off, 4)) == "late":
			t.Fatalf("a write answered NBD_ESHUTDOWN was carried out")
		}
	}
	if _, err := c.Disconnect(); err != nil {
		t.Fatal(err)
	}
	if err := <-shutdown; err != nil {
		t.Fatal(err)
	}
	if string(mem.Bytes(0, 4)) != "abcd" {
		t.Fatal("write lost")
	}
}
