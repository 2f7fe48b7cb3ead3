package node

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkReplicatedWrite8K: 8 KiB random writes at queue depth 16 through
// the volume (no NBD), alpha to beta over real gRPC on 127.0.0.1.
func BenchmarkReplicatedWrite8K(b *testing.B) { benchmarkWrites(b, false, 8192, true) }

// BenchmarkReplicatedWrite8KTLS: the same over mutual TLS (tls: set).
func BenchmarkReplicatedWrite8KTLS(b *testing.B) { benchmarkWrites(b, true, 8192, true) }

// BenchmarkReplicatedWrite1M: 1 MiB sequential writes at queue depth 16.
func BenchmarkReplicatedWrite1M(b *testing.B) { benchmarkWrites(b, false, 1<<20, false) }

// BenchmarkReplicatedWrite1MTLS: the same over mutual TLS.
func BenchmarkReplicatedWrite1MTLS(b *testing.B) { benchmarkWrites(b, true, 1<<20, false) }

// BenchmarkLocalOnlyWrite1M: 1 MiB sequential writes at queue depth 16
// with the peer disconnected (replctl disconnect): every write goes to the
// local disk and the peer's bitmap.
func BenchmarkLocalOnlyWrite1M(b *testing.B) { benchmarkWritesOf(b, false, 1<<20, false, true) }

func benchmarkWrites(b *testing.B, secure bool, size int64, random bool) {
	benchmarkWritesOf(b, secure, size, random, false)
}

func benchmarkWritesOf(b *testing.B, secure bool, size int64, random, localOnly bool) {
	c := newTestCluster(b, 256<<20)
	if secure {
		withTLS(b, c)
	}
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	v := c.vol("alpha")
	if localOnly {
		v.setAdminDown(true)
	}
	var next atomic.Int64
	b.SetBytes(size)
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			buf := make([]byte, size)
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				off := (i % (v.size.Load() / size)) * size
				if random {
					off = r.Int64N(v.size.Load()/size) * size
				}
				if err := v.WriteAt(context.Background(), buf, off, false); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
