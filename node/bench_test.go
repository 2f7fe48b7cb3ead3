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
func BenchmarkReplicatedWrite8K(b *testing.B) {
	c := newTestCluster(b, 256<<20)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	v := c.vol("alpha")
	var next atomic.Int64
	b.SetBytes(8192)
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			buf := make([]byte, 8192)
			for next.Add(1) <= int64(b.N) {
				off := r.Int64N(v.size/8192) * 8192
				if err := v.WriteAt(context.Background(), buf, off, false); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
