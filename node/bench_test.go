package node

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkReplicatedWrite8K: 8 KiB random writes at queue depth 16 through
// the volume (no NBD), alpha to beta over real gRPC on 127.0.0.1.
func BenchmarkReplicatedWrite8K(b *testing.B) { benchmarkWrites(b, false, 8192, true) }

// BenchmarkReplicatedWrite8KThreeReplicas: the same with a second peer,
// gamma: alpha streams every write to beta and gamma and completes it once
// both acknowledged it. Its cpu-us/op over BenchmarkReplicatedWrite8K's is
// what a third replica costs (every node runs in this process), the
// primary's fan-out to a second stream and the third node's own work.
func BenchmarkReplicatedWrite8KThreeReplicas(b *testing.B) {
	benchmarkWritesOn(b, newTestClusterOf(b, 256<<20, "alpha", "beta", "gamma"), false, 8192, true, false)
}

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
	benchmarkWritesOn(b, newTestCluster(b, 256<<20), secure, size, random, localOnly)
}

// benchmarkWritesOn writes through c's first node, with every node of c
// started; it reports the CPU time of the process per write (cpu-us/op:
// every node's, user and system), which a loaded machine disturbs less
// than the time per write.
func benchmarkWritesOn(b *testing.B, c *testCluster, secure bool, size int64, random, localOnly bool) {
	if secure {
		withTLS(b, c)
	}
	for _, n := range c.cfg.Nodes {
		c.start(n.Name)
	}
	c.waitInSync()
	v := c.vol(c.cfg.Nodes[0].Name)
	if localOnly {
		v.setAdminDown(true)
	}
	var next atomic.Int64
	b.SetBytes(size)
	cpu0 := processCPU(b)
	b.ResetTimer()
	defer func() {
		b.StopTimer()
		b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
	}()
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

// BenchmarkResync256M: a bitmap resync of a whole 256 MiB volume of data
// (64 activity-log extents), alpha to beta over real gRPC on 127.0.0.1:
// beta is disconnected while alpha writes every block, then reconnected;
// the time from the reconnection to beta in sync is measured. The target
// admits each extent to its activity log, one transaction per extent.
func BenchmarkResync256M(b *testing.B) {
	const size = 256 << 20
	c := newTestCluster(b, size)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a, t := c.vol("alpha"), c.vol("beta")
	ctx := context.Background()
	buf := make([]byte, 1<<20)
	b.SetBytes(size)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		t.setAdminDown(true)
		for off := int64(0); off < size; off += int64(len(buf)) {
			buf[0], buf[len(buf)-1] = byte(i+1), byte(off>>20)
			if err := a.WriteAt(ctx, buf, off, false); err != nil {
				b.Fatal(err)
			}
		}
		before := t.counters.resynced.Load()
		b.StartTimer()
		t.setAdminDown(false)
		c.waitInSync()
		b.StopTimer()
		if moved := t.counters.resynced.Load() - before; moved != size {
			b.Fatalf("resync moved %d bytes, want %d", moved, size)
		}
	}
}

// processCPU is the CPU time (user and system) this process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
