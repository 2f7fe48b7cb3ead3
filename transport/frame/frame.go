package frame

import "unsafe"

// HeaderLen is the length of the stream's header in front of each frame
// (kind, then length: transport's stream.go); a frame built with New
// keeps room for it, so that it goes out in one write.
const HeaderLen = 5

// MaxSize bounds one replication message, both ways and on both ends:
// the longest frame the replication wire format makes, a batch of one
// entry of 32 MiB (replication.MaxFrameLen: this package does not import
// the rules, the session checks that the two agree). A stream refuses to
// send a longer one, and a receiver ends the stream on its header, before
// a byte of it is buffered.
const MaxSize = 5 + 24 + 32<<20

// Frame is one message of the replication stream: an encoded frame of the
// replication wire format. A Frame handed to a stream's Send must not be
// touched again: the stream returns its buffer to the pool once it is on
// the wire.
type Frame struct {
	buf *[]byte
	// head: *buf keeps HeaderLen bytes of room in front of the frame's
	// bytes, so it goes out in one write.
	head bool
	// refs are bytes the frame carries by reference (Ref), in order.
	refs []Ref
}

// Ref is a piece of a frame held by reference: B goes after the first At
// bytes of the frame's own bytes.
type Ref struct {
	At int
	B  []byte
}

// Ref makes b part of the frame, after the first at bytes of Bytes(), by
// reference: on a plain TCP stream it is written from where it lies (one
// writev for the frame), on TLS it is copied once into the record. b must
// not change until Send returned or the frame was released. References
// come in order (at never decreases) and at is at most len(Bytes()) when
// the frame is sent.
func (f *Frame) Ref(at int, b []byte) {
	if len(b) > 0 {
		f.refs = append(f.refs, Ref{At: at, B: b})
	}
}

// Refs returns the frame's references in order (the frame's own slice:
// the caller does not change it).
func (f *Frame) Refs() []Ref { return f.refs }

// AppendContents appends the frame's whole contents to dst: its bytes,
// with what it holds by reference in place.
func (f *Frame) AppendContents(dst []byte) []byte {
	own, prev := f.Bytes(), 0
	for _, r := range f.refs {
		dst = append(append(dst, own[prev:r.At]...), r.B...)
		prev = r.At
	}
	return append(dst, own[prev:]...)
}

// Len is the frame's length: its bytes and what it holds by reference.
func (f *Frame) Len() int {
	n := len(f.Bytes())
	for _, r := range f.refs {
		n += len(r.B)
	}
	return n
}

// Bytes returns the frame's contents.
func (f *Frame) Bytes() []byte {
	switch {
	case f.buf == nil:
		return nil
	case f.head:
		return (*f.buf)[HeaderLen:]
	}
	return *f.buf
}

// Released reports whether the frame has no buffer: it was released (or
// sent), or never had bytes.
func (f *Frame) Released() bool { return f.buf == nil }

// Headed returns the frame's buffer with the room for the header in
// front of its bytes (HeaderLen bytes, then Bytes()), or nil if it has
// no such room.
func (f *Frame) Headed() []byte {
	if f.buf == nil || !f.head {
		return nil
	}
	return *f.buf
}

// New returns a frame with an empty buffer of capacity n from the pool.
// Append to Bytes() and set it back with SetBytes.
func New(n int) *Frame {
	b := pool.Get(HeaderLen + n)
	*b = (*b)[:HeaderLen]
	return &Frame{buf: b, head: true}
}

// SetBytes replaces the frame contents (b should be grown from Bytes():
// then the frame keeps its room for the header and goes out in one write).
func (f *Frame) SetBytes(b []byte) {
	if f.buf != nil && f.head && hasRoom(*f.buf, b) {
		*f.buf = (*f.buf)[:HeaderLen+len(b)]
		return
	}
	if f.buf == nil {
		f.buf = new([]byte)
	}
	*f.buf, f.head = b, false
}

// Fill readies the frame to receive n bytes and returns them, for the
// caller to fill whole: its buffer is reused when it is large enough,
// else one of the pool's replaces it; the frame keeps no room for a
// header.
func (f *Frame) Fill(n int) []byte {
	if f.buf == nil || cap(*f.buf) < n {
		f.Release()
		f.buf = pool.Get(n)
	}
	f.head = false
	*f.buf = (*f.buf)[:n]
	return *f.buf
}

// Release returns the frame's buffer to the pool; the frame must not be
// used afterwards. Only frames that were not sent need it.
func (f *Frame) Release() {
	if f.buf != nil {
		pool.Put(f.buf)
		f.buf = nil
	}
	f.refs = nil
}

// hasRoom reports whether b begins HeaderLen bytes into base, so that
// base[:HeaderLen+len(b)] is the header and b.
func hasRoom(base, b []byte) bool {
	if cap(base) <= HeaderLen || cap(b) == 0 {
		return cap(b) == 0
	}
	return unsafe.SliceData(b) == &base[:cap(base)][HeaderLen]
}
