package nbd_test

import (
	"encoding/binary"
	"io"
	"net"
	"testing"

	"github.com/replvol/replvol/transport/nbd"
	"github.com/replvol/replvol/transport/nbd/nbdtest"
)

// BenchmarkRequests pipelines 4 KiB and 1 MiB requests over one connection (as many in flight
// as TCP buffers and the connection's budget allow) with a client that reuses its buffers, so
// allocs/op is the server's; plaintext and over TLS (STARTTLS with the cluster CA's
// certificates), side by side.
func BenchmarkRequests(b *testing.B) {
	for _, bc := range []struct {
		name string
		cmd  uint16
		size int
	}{
		{"read4k", nbdtest.CmdRead, 4096}, {"write4k", nbdtest.CmdWrite, 4096},
		{"read1m", nbdtest.CmdRead, 1 << 20}, {"write1m", nbdtest.CmdWrite, 1 << 20},
	} {
		b.Run(bc.name, func(b *testing.B) {
			benchmarkRequests(b, bc.cmd, bc.size, nil)
		})
	}
	p := newTestPKI(b)
	for _, bc := range []struct {
		name string
		cmd  uint16
		size int
	}{
		{"tls/read4k", nbdtest.CmdRead, 4096}, {"tls/write4k", nbdtest.CmdWrite, 4096},
		{"tls/read1m", nbdtest.CmdRead, 1 << 20}, {"tls/write1m", nbdtest.CmdWrite, 1 << 20},
	} {
		b.Run(bc.name, func(b *testing.B) {
			benchmarkRequests(b, bc.cmd, bc.size, p)
		})
	}
}

const benchExportSize = 64 << 20

func benchmarkRequests(b *testing.B, cmd uint16, size int, p *testPKI) {
	cfg := nbd.Config{Resolver: &testResolver{exports: map[string]nbd.Export{"vol": nbdtest.NewMemExport(benchExportSize)}}}
	if p != nil {
		cfg.TLS = p.server
	}
	s := nbd.NewServer(cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve(l)
	defer s.Shutdown(b.Context())
	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	h, err := nbdtest.Greet(conn, nbdtest.ClientFixedNewstyle|nbdtest.ClientNoZeroes)
	if err != nil {
		b.Fatal(err)
	}
	if p != nil {
		if err := h.StartTLS(p.client); err != nil {
			b.Fatal(err)
		}
	}
	c, _, err := h.Go("vol")
	if err != nil {
		b.Fatal(err)
	}

	req := make([]byte, 28, 28+size)
	binary.BigEndian.PutUint32(req[0:], nbdtest.MagicRequest)
	binary.BigEndian.PutUint16(req[6:], cmd)
	binary.BigEndian.PutUint32(req[24:], uint32(size))
	replyLen := 16
	if cmd == nbdtest.CmdWrite {
		req = req[:28+size]
	} else {
		replyLen += size
	}
	offsets := min(4096, benchExportSize/size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	done := make(chan error, 1)
	go func() {
		reply := make([]byte, replyLen)
		for range b.N {
			if _, err := io.ReadFull(c.Conn, reply); err != nil { // bypasses Client.Receive: no allocations
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := range b.N {
		binary.BigEndian.PutUint64(req[8:], uint64(i))
		binary.BigEndian.PutUint64(req[16:], uint64(i%offsets)*uint64(size))
		if _, err := c.Conn.Write(req); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
