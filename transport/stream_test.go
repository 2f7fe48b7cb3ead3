package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// byteConn is a connection that reads from fixed bytes and takes every
// write: what a hostile peer sent, after the preambles.
type byteConn struct {
	net.Conn // nil: the methods below are the only ones called
	r        *bytes.Reader
	wrote    bytes.Buffer
	closed   bool
}

func (c *byteConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *byteConn) Write(p []byte) (int, error)      { return c.wrote.Write(p) }
func (c *byteConn) Close() error                     { c.closed = true; return nil }
func (c *byteConn) SetDeadline(time.Time) error      { return nil }
func (c *byteConn) SetReadDeadline(time.Time) error  { return nil }
func (c *byteConn) SetWriteDeadline(time.Time) error { return nil }

// encodeFrames is a stream of the given frames, then a clean end.
func encodeFrames(frames ...[]byte) []byte {
	var b []byte
	for _, f := range frames {
		var hdr [frameHeaderLen]byte
		putHeader(hdr[:], kindFrame, len(f))
		b = append(append(b, hdr[:]...), f...)
	}
	var hdr [frameHeaderLen]byte
	putHeader(hdr[:], kindEnd, 1)
	return append(append(b, hdr[:]...), byte(endClean))
}

// decodeAll reads frames from b as a receiver does, until the stream
// ends: the frames, and how it ended.
func decodeAll(b []byte) ([][]byte, error) {
	return decodeAllThrough(b, acceptedReadBuffer)
}

// decodeAllThrough is decodeAll through a read buffer of size bytes.
func decodeAllThrough(b []byte, size int) ([][]byte, error) {
	fc := newFrameConn(context.Background(), &byteConn{r: bytes.NewReader(b)}, nil, size)
	defer fc.cancel()
	var got [][]byte
	f := &Frame{}
	defer f.Release()
	for {
		if err := fc.RecvMsg(f); err != nil {
			return got, err
		}
		got = append(got, bytes.Clone(f.Bytes()))
	}
}

// TestTheFramingRoundTrips: frames of every size class read back as they
// were sent, in order, and a clean end reads as io.EOF, through either
// side's read buffer.
func TestTheFramingRoundTrips(t *testing.T) {
	for _, size := range []int{acceptedReadBuffer, dialledReadBuffer} {
		want := [][]byte{{}, []byte("a"), bytes.Repeat([]byte{7}, size-3), bytes.Repeat([]byte{8}, size+5), bytes.Repeat([]byte{9}, 3*acceptedReadBuffer+1), []byte("last")}
		got, err := decodeAllThrough(encodeFrames(want...), size)
		if err != io.EOF {
			t.Fatalf("buffer of %d: the stream ended with %v, want io.EOF", size, err)
		}
		if len(got) != len(want) {
			t.Fatalf("buffer of %d: read %d frames, sent %d", size, len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("buffer of %d: frame %d: %d bytes differ from the %d sent", size, i, len(got[i]), len(want[i]))
			}
		}
	}
}

// TestAStreamThatIsNotTheFramingEndsInWords: a truncated frame, an
// unknown kind, an end without a code and an oversized header each end
// the stream with a *StreamError, never a panic or an allocation of the
// size a header claims.
func TestAStreamThatIsNotTheFramingEndsInWords(t *testing.T) {
	frame := encodeFrames([]byte("0123456789"))
	for _, tc := range []struct {
		name string
		b    []byte
		want string
		is   error
	}{
		{"cut inside a frame", frame[:frameHeaderLen+4], "connection lost: the peer closed the connection", io.ErrUnexpectedEOF},
		{"cut inside a header", frame[:3], "connection lost: the peer closed the connection", io.ErrUnexpectedEOF},
		{"no end", frame[:frameHeaderLen+10], "connection lost: the peer closed the connection", io.ErrUnexpectedEOF},
		{"an unknown kind", []byte{9, 0, 0, 0, 1, 'x'}, "unknown kind 9", errMalformed},
		{"an end without a code", []byte{kindEnd, 0, 0, 0, 0}, "an end of 0 bytes", errMalformed},
		{"an end too long", []byte{kindEnd, 0, 1, 0, 0}, "an end of 65536 bytes", errMalformed},
		{"a frame over the limit", []byte{kindFrame, 0xff, 0xff, 0xff, 0xff}, "the peer sent a frame of 4294967295 bytes, over the limit", ErrFrameTooLarge},
		{"the peer's error", append([]byte{kindEnd, 0, 0, 0, 5, byte(endError)}, "dead"...), "the peer ended the stream: dead", errPeerEnded},
		{"the peer refused a frame", append([]byte{kindEnd, 0, 0, 0, 4, byte(endTooLarge)}, "big"...), "frame too large for the peer: big", ErrFrameTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeAll(tc.b)
			var se *StreamError
			if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.is) {
				t.Fatalf("ended with %v (%T), want a *StreamError saying %q that is %v", err, err, tc.want, tc.is)
			}
		})
	}
}

// TestAFrameGoesOutInOneWrite: a frame built with NewFrame keeps room for
// its header and is written once, header and bytes together; one without
// that room (SetBytes of another slice) goes out whole too.
func TestAFrameGoesOutInOneWrite(t *testing.T) {
	c := &countingConn{}
	fc := newFrameConn(context.Background(), c, nil, acceptedReadBuffer)
	defer fc.cancel()
	f := NewFrame(4)
	f.SetBytes(append(f.Bytes(), "abcd"...))
	if f.Headed() == nil {
		t.Fatal("a frame grown in place lost its room for the header")
	}
	if err := fc.SendMsg(f); err != nil {
		t.Fatal(err)
	}
	if c.writes != 1 {
		t.Fatalf("a frame took %d writes, want 1", c.writes)
	}
	g := NewFrame(1)
	g.SetBytes([]byte("elsewhere"))
	if err := fc.SendMsg(g); err != nil {
		t.Fatal(err)
	}
	got, err := decodeAll(append(c.buf.Bytes(), kindEnd, 0, 0, 0, 1, byte(endClean)))
	if err != io.EOF || len(got) != 2 || string(got[0]) != "abcd" || string(got[1]) != "elsewhere" {
		t.Fatalf("read back %q, %v", got, err)
	}
}

// TestAFrameCarriesItsReferencesInOrder: bytes a frame holds by
// reference (Ref) arrive where they were placed, between its own bytes,
// over plain TCP (one writev) and over a connection that is not TCP (TLS:
// one write of the frame copied whole), for a frame with room for its
// header and one without.
func TestAFrameCarriesItsReferencesInOrder(t *testing.T) {
	build := func(head bool) (*Frame, []byte) {
		f := NewFrame(16)
		b := append(f.Bytes(), "hd"...)
		f.Ref(len(b), []byte("AAAA"))
		f.Ref(len(b), []byte("BB")) // two references in a row
		b = append(b, "mid"...)
		f.Ref(len(b), bytes.Repeat([]byte{'C'}, 3*acceptedReadBuffer))
		b = append(b, "tail"...)
		if head {
			f.SetBytes(b)
		} else {
			f.SetBytes(bytes.Clone(b))
		}
		want := "hdAAAABBmid" + strings.Repeat("C", 3*acceptedReadBuffer) + "tail"
		return f, []byte(want)
	}
	t.Run("not TCP", func(t *testing.T) {
		for _, head := range []bool{true, false} {
			c := &countingConn{}
			fc := newFrameConn(context.Background(), c, nil, acceptedReadBuffer)
			f, want := build(head)
			if f.Len() != len(want) {
				t.Fatalf("Len() = %d, want %d", f.Len(), len(want))
			}
			if err := fc.SendMsg(f); err != nil {
				t.Fatal(err)
			}
			fc.cancel()
			if c.writes != 1 {
				t.Fatalf("the frame took %d writes, want 1", c.writes)
			}
			got, err := decodeAll(append(c.buf.Bytes(), kindEnd, 0, 0, 0, 1, byte(endClean)))
			if err != io.EOF || len(got) != 1 || !bytes.Equal(got[0], want) {
				t.Fatalf("head %v: read back %d frames (%v), want the frame of %d bytes", head, len(got), err, len(want))
			}
		}
	})
	t.Run("TCP", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			c, _ := ln.Accept()
			accepted <- c
		}()
		client, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		server := <-accepted
		if server == nil {
			t.Fatal("no connection accepted")
		}
		send := newFrameConn(context.Background(), client, nil, acceptedReadBuffer)
		recv := newFrameConn(context.Background(), server, nil, acceptedReadBuffer)
		defer send.cancel()
		defer recv.cancel()
		var wants [][]byte
		go func() {
			for _, head := range []bool{true, false} {
				f, _ := build(head)
				if err := send.SendMsg(f); err != nil {
					t.Error(err)
				}
			}
		}()
		for _, head := range []bool{true, false} {
			_, want := build(head)
			wants = append(wants, want)
		}
		f := &Frame{}
		defer f.Release()
		for i, want := range wants {
			if err := recv.RecvMsg(f); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(f.Bytes(), want) {
				t.Fatalf("frame %d: %d bytes differ from the %d sent", i, len(f.Bytes()), len(want))
			}
		}
	})
}

type countingConn struct {
	byteConn
	buf    bytes.Buffer
	writes int
}

func (c *countingConn) Write(p []byte) (int, error) { c.writes++; return c.buf.Write(p) }

// FuzzReplStreamDecoder: whatever a peer sends after the preambles, the
// receiver ends in an error (io.EOF or a *StreamError), never a panic,
// and never returns a frame over MaxFrameSize; the frames it returns are
// what a sender of them would have written.
func FuzzReplStreamDecoder(f *testing.F) {
	f.Add(encodeFrames([]byte("hello"), nil, bytes.Repeat([]byte{1}, 100)))
	f.Add([]byte{kindFrame, 0, 0, 0, 3, 'a', 'b'})
	f.Add(append([]byte{kindEnd, 0, 0, 0, 3, byte(endError)}, "no"...))
	f.Add([]byte{kindFrame, 0x7f, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		frames, err := decodeAll(b)
		var se *StreamError
		if err != io.EOF && !errors.As(err, &se) {
			t.Fatalf("ended with %v (%T)", err, err)
		}
		for _, fr := range frames {
			if len(fr) > MaxFrameSize {
				t.Fatalf("a frame of %d bytes", len(fr))
			}
		}
		// The frames read are a prefix of b, as encodeFrames writes them.
		if enc := encodeFrames(frames...); len(frames) > 0 && !bytes.HasPrefix(b, enc[:len(enc)-frameHeaderLen-1]) {
			t.Fatalf("decoded frames do not re-encode to the stream's start")
		}
	})
}

// TestALongFrameSaysItIsArriving: the framing says when a frame of
// LongFrame bytes or more begins to arrive, and counts the bytes as they
// come, before the frame is whole (transport.Arrivals: a receiver tells
// its peer it is alive while a long frame crosses a slow link); a short
// frame says nothing of a long one.
func TestALongFrameSaysItIsArriving(t *testing.T) {
	near, far := net.Pipe()
	defer far.Close()
	fc := newFrameConn(context.Background(), near, nil, acceptedReadBuffer)
	defer fc.close()
	var arr Arrivals = fc

	write := func(b []byte) {
		t.Helper()
		if _, err := far.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	header := func(n int) []byte {
		h := make([]byte, frameHeaderLen)
		putHeader(h, kindFrame, n)
		return h
	}
	got := make(chan error, 1)
	recv := func(f *Frame) { got <- fc.RecvMsg(f) }

	// A short frame.
	f := &Frame{}
	go recv(f)
	write(header(100))
	write(make([]byte, 100))
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	select {
	case <-arr.LongFrames():
		t.Fatal("a short frame said a long one arrives")
	default:
	}
	now, before := arr.Arriving()
	if now || before != frameHeaderLen+100 {
		t.Fatalf("after a short frame: arriving %v, %d bytes; want not arriving, %d bytes", now, before, frameHeaderLen+100)
	}

	// A long one, in parts: net.Pipe's writes return once read.
	const part = 64 << 10
	size := 3*part + 1000
	go recv(f)
	write(header(size))
	write(make([]byte, part))
	select {
	case <-arr.LongFrames():
	case <-time.After(10 * time.Second):
		t.Fatal("no word of a long frame arriving")
	}
	write(make([]byte, part))
	// The second part was read, so the first was counted.
	if now, n := arr.Arriving(); !now || n-before < part {
		t.Fatalf("a long frame halfway: arriving %v, %d bytes of it; want it arriving, %d or more", now, n-before, part)
	}
	select {
	case err := <-got:
		t.Fatalf("the long frame was received before it was whole: %v", err)
	default:
	}
	write(make([]byte, size-2*part))
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if len(f.Bytes()) != size {
		t.Fatalf("received %d bytes, want %d", len(f.Bytes()), size)
	}
	if now, n := arr.Arriving(); now || n-before != int64(frameHeaderLen+size) {
		t.Fatalf("after the long frame: arriving %v, %d bytes of it; want not arriving, %d", now, n-before, frameHeaderLen+size)
	}
}
