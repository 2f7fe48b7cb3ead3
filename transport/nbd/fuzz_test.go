package nbd

// Fuzz targets for everything the server decodes from a client: the request header and its
// validation, the NBD_OPT_INFO/GO payload, and whole client byte streams (handshake and
// transmission). The property in every case: no panic, and no request outside the export, of
// zero length or over MaxRequestLength ever reaches the Export.
//
//	go test -fuzz=FuzzRequestCheck ./transport/nbd
//	go test -fuzz=FuzzInfoRequest ./transport/nbd
//	go test -fuzz=FuzzClientStream ./transport/nbd

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

func encodeRequest(flags, cmd uint16, handle, offset uint64, length uint32) []byte {
	b := binary.BigEndian.AppendUint32(nil, magicRequest)
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint16(b, cmd)
	b = binary.BigEndian.AppendUint64(b, handle)
	b = binary.BigEndian.AppendUint64(b, offset)
	return binary.BigEndian.AppendUint32(b, length)
}

func FuzzRequestCheck(f *testing.F) {
	f.Add(encodeRequest(0, cmdRead, 1, 0, 4096), int64(1<<20), false)
	f.Add(encodeRequest(cmdFlagFUA, cmdWrite, 2, 1<<20-1, 1), int64(1<<20), false)
	f.Add(encodeRequest(0, cmdTrim, 3, 1<<63, 1<<31), int64(1<<20), false)
	f.Add(encodeRequest(cmdFlagNoHole, cmdWriteZeroes, 4, ^uint64(0), 1), int64(1<<20), true)
	f.Add(encodeRequest(0, 99, 5, 0, 0), int64(0), false)
	f.Add(make([]byte, requestHeaderSize), int64(512), false)
	f.Fuzz(func(t *testing.T, b []byte, size int64, readOnly bool) {
		if len(b) < requestHeaderSize {
			return
		}
		h, err := parseRequestHeader((*[requestHeaderSize]byte)(b))
		if err != nil {
			if binary.BigEndian.Uint32(b) == magicRequest {
				t.Fatalf("good magic rejected: %v", err)
			}
			return
		}
		if h.cmd == cmdDisc {
			return // handled before check
		}
		errno := h.check(size, readOnly)
		if errno == 0 {
			switch h.cmd {
			case cmdRead, cmdWrite, cmdTrim, cmdWriteZeroes:
				if h.length == 0 || size < 0 || h.offset > uint64(size) || uint64(h.length) > uint64(size)-h.offset {
					t.Fatalf("accepted out-of-range %+v for size %d", h, size)
				}
				if (h.cmd == cmdRead || h.cmd == cmdWrite) && h.length > MaxRequestLength {
					t.Fatalf("accepted over-long %+v", h)
				}
				if readOnly && h.cmd != cmdRead {
					t.Fatalf("accepted %+v on a read-only export", h)
				}
			case cmdFlush:
			default:
				t.Fatalf("accepted unknown command %+v", h)
			}
		}
		switch errno {
		case 0, errnoInval, errnoNoSpace, errnoPerm:
		default:
			t.Fatalf("check returned errno %d", errno)
		}
	})
}

func FuzzInfoRequest(f *testing.F) {
	f.Add(nbdtest.InfoPayload("vol"))
	f.Add(nbdtest.InfoPayload("", infoName, infoDescription, infoBlockSize))
	f.Add([]byte{0, 0, 0, 1, 'v', 0, 1})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := parseInfoRequest(data)
		if err != nil {
			return
		}
		// Whatever parses must re-encode to exactly the input: nothing skipped or invented.
		if got := nbdtest.InfoPayload(req.name, req.infos...); !bytes.Equal(got, data) {
			t.Fatalf("parsed %+v from %x, which re-encodes to %x", req, data, got)
		}
	})
}

// streamConn is a net.Conn whose client side is a fixed byte stream; replies are discarded.
type streamConn struct {
	r      *bytes.Reader
	mu     sync.Mutex
	closed bool
}

func (c *streamConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	return c.r.Read(p)
}

func (c *streamConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	return len(p), nil
}

func (c *streamConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *streamConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *streamConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *streamConn) SetDeadline(time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }

type fuzzResolver struct{ lookup func(string) (Export, error) }

func (r fuzzResolver) List() []string                     { return []string{"vol"} }
func (r fuzzResolver) Lookup(name string) (Export, error) { return r.lookup(name) }

func option(id uint32, data []byte) []byte {
	b := binary.BigEndian.AppendUint64(nil, magicOption)
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

func FuzzClientStream(f *testing.F) {
	flags := []byte{0, 0, 0, 3}
	goVol := option(optGo, nbdtest.InfoPayload("vol", infoBlockSize))
	requests := bytes.Join([][]byte{
		encodeRequest(0, cmdWrite, 1, 100, 4), []byte("abcd"),
		encodeRequest(0, cmdRead, 2, 0, 512),
		encodeRequest(cmdFlagFUA, cmdTrim, 3, 4096, 4096),
		encodeRequest(cmdFlagNoHole, cmdWriteZeroes, 4, 0, 1),
		encodeRequest(0, cmdFlush, 5, 0, 0),
		encodeRequest(0, cmdRead, 6, 65535, 2),
		encodeRequest(0, cmdWrite, 7, 65535, 2), []byte("xy"),
		encodeRequest(0, 5, 8, 0, 100),
		encodeRequest(0, cmdDisc, 9, 0, 0),
	}, nil)
	f.Add(bytes.Join([][]byte{flags, goVol, requests}, nil))
	f.Add(bytes.Join([][]byte{flags, option(optExportName, []byte("vol")), requests}, nil))
	f.Add(bytes.Join([][]byte{flags, option(optList, nil), option(optInfo, nbdtest.InfoPayload("x")),
		option(99, []byte("?")), option(optAbort, nil)}, nil))
	f.Add(bytes.Join([][]byte{{0, 0, 0, 1}, goVol, encodeRequest(0, cmdWrite, 1, 0, 1<<25+1)}, nil))
	f.Fuzz(func(t *testing.T, stream []byte) {
		mem := nbdtest.NewMemExport(64 << 10)
		s := NewServer(Config{Resolver: fuzzResolver{func(name string) (Export, error) {
			if name == "vol" {
				return mem, nil
			}
			return nil, errors.New(name + ": no such export")
		}}})
		conn := &streamConn{r: bytes.NewReader(stream)}
		slot, err := s.admission.Admit(conn)
		if err != nil {
			t.Fatal(err)
		}
		c := newServerConn(s, conn, slot)
		c.serve() // returns when the stream ends, after every worker has answered
		if n := mem.OutOfRange(); n != 0 {
			t.Fatalf("%d out-of-range calls reached the Export", n)
		}
	})
}
