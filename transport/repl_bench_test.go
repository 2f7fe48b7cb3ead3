package transport

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/internal/pki"
)

// BenchmarkReplStream1MiB and BenchmarkReplStream1MiBTLS: 1 MiB frames
// one way, a few in flight, each acknowledged by a small frame, over
// 127.0.0.1: what TLS costs the stream itself. cpu-ns/op is the process's
// CPU time per frame (both ends), steadier than the wall time on a busy
// machine.
func BenchmarkReplStream1MiB(b *testing.B)    { benchmarkStream(b, false, 1<<20) }
func BenchmarkReplStream1MiBTLS(b *testing.B) { benchmarkStream(b, true, 1<<20) }
func BenchmarkReplStream8KiB(b *testing.B)    { benchmarkStream(b, false, 8<<10) }
func BenchmarkReplStream8KiBTLS(b *testing.B) { benchmarkStream(b, true, 8<<10) }

func benchmarkStream(b *testing.B, secure bool, size int) {
	var serverOpts, clientOpts []ReplOption
	if secure {
		bs := benchBundles(b)
		serverOpts = append(serverOpts, ReplTLS(bs[1].ServerConfig(true, pki.Roles(pki.RoleNode))))
		clientOpts = append(clientOpts, ReplTLS(bs[0].ClientConfig("127.0.0.1", pki.Exactly(pki.Identity{Role: pki.RoleNode, Name: "b"}))))
	}
	srv := NewReplServer(func(s *ReplStream) error {
		f := &Frame{}
		defer f.Release()
		for {
			if err := s.Recv(f); err != nil {
				return nil
			}
			ack := NewFrame(16)
			ack.SetBytes(append(ack.Bytes(), make([]byte, 16)...))
			if err := s.Send(ack); err != nil {
				return err
			}
		}
	}, serverOpts...)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	c, err := DialRepl(ln.Addr().String(), clientOpts...)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	s, err := c.Open(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const window = 4
	acks := make(chan error, window)
	go func() {
		f := &Frame{}
		defer f.Release()
		for range b.N {
			acks <- s.Recv(f)
		}
	}()
	payload := make([]byte, size)
	b.SetBytes(int64(size))
	cpu0 := cpuTime()
	b.ResetTimer()
	inflight := 0
	for range b.N {
		if inflight == window {
			if err := <-acks; err != nil {
				b.Fatal(err)
			}
			inflight--
		}
		f := NewFrame(size)
		f.SetBytes(append(f.Bytes(), payload...))
		if err := s.Send(f); err != nil {
			b.Fatal(err)
		}
		inflight++
	}
	for ; inflight > 0; inflight-- {
		if err := <-acks; err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchBundles(b *testing.B) []*pki.Bundle {
	dir := b.TempDir()
	hs := []pki.Holder{
		{Identity: pki.Identity{Role: pki.RoleNode, Name: "a"}, Hosts: []string{"127.0.0.1"}},
		{Identity: pki.Identity{Role: pki.RoleNode, Name: "b"}, Hosts: []string{"127.0.0.1"}},
	}
	if _, err := pki.Init(dir, hs, false); err != nil {
		b.Fatal(err)
	}
	var out []*pki.Bundle
	for _, n := range []string{"a", "b"} {
		bd, err := pki.Load(dir+"/"+pki.CAFile, dir+"/"+pki.CertFile(n), dir+"/"+pki.KeyFile(n))
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, bd)
	}
	return out
}
