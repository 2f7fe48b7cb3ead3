//go:build linux

package metadata

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// fileDevice is a metadata device on a file, synced with fdatasync.
type fileDevice struct{ *os.File }

func (d fileDevice) Sync() error { return syscall.Fdatasync(int(d.Fd())) }

// benchVolume is a 1 GiB volume on a file, written 8 KiB at a time with
// O_DSYNC (each write on stable storage before it returns, like a write a
// replica acknowledges), its metadata internal (at the end of the same
// file) or external (a second file in the same directory).
type benchVolume struct {
	data   *os.File
	md     *MD
	usable int64
	r      *rand.Rand
	buf    []byte
}

func newBenchVolume(b *testing.B, p Placement, alExtents int) *benchVolume {
	const size = 1 << 30
	dir := b.TempDir()
	data, err := os.OpenFile(filepath.Join(dir, "data"), os.O_RDWR|os.O_CREATE|syscall.O_DSYNC, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { data.Close() })
	if err := syscall.Fallocate(int(data.Fd()), 0, 0, size); err != nil {
		b.Fatal(err)
	}
	mdPath := filepath.Join(dir, "data")
	if p == External {
		mdPath = filepath.Join(dir, "md")
	}
	mf, err := os.OpenFile(mdPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { mf.Close() })
	md, err := CreateMD(fileDevice{mf}, MDOptions{
		Placement: p, DeviceSize: size, Volume: testVolume, NodeID: nodeAlpha,
		Peers: []uint32{nodeBeta}, ALExtents: alExtents,
	})
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 8192)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	return &benchVolume{data: data, md: md, usable: md.UsableSize(), r: rand.New(rand.NewPCG(1, 2)), buf: buf}
}

// write does one 8 KiB random write the way the primary's data path does:
// Admit (the AL transaction, if cold, on disk first), the data write, Done.
func (v *benchVolume) write(b *testing.B) {
	off := v.r.Int64N(v.usable/8192) * 8192
	al := v.md.ActivityLog()
	if err := al.Admit(context.Background(), off, 8192); err != nil {
		b.Fatal(err)
	}
	if _, err := v.data.WriteAt(v.buf, off); err != nil {
		b.Fatal(err)
	}
	al.Done(off, 8192)
}

// BenchmarkRandomWrite8K compares 8 KiB random writes over a 1 GiB volume
// with internal and external metadata, interleaved in rounds of 64 writes
// so that both see the same disk conditions. With the default al-extents
// the whole volume stays hot and neither pays metadata I/O after warm-up;
// with al-extents 61 three writes in four miss the AL and each costs an AL
// transaction and an fdatasync, on the same file (internal) or another
// (external). The metric internal/external is the throughput ratio; the
// target is ≥ 0.9.
//
//	go test ./metadata -run '^$' -bench RandomWrite8K -benchtime 4000x
func BenchmarkRandomWrite8K(b *testing.B) {
	for _, alExtents := range []int{DefaultALExtents, 61} {
		b.Run(fmt.Sprintf("al-extents=%d", alExtents), func(b *testing.B) {
			in := newBenchVolume(b, Internal, alExtents)
			ex := newBenchVolume(b, External, alExtents)
			for range 512 { // warm-up: fill the AL
				in.write(b)
				ex.write(b)
			}
			var tin, tex time.Duration
			warm := in.md.ActivityLog().Stats().Transactions
			b.ResetTimer()
			for done := 0; done < b.N; {
				n := min(64, b.N-done)
				start := time.Now()
				for range n {
					in.write(b)
				}
				mid := time.Now()
				for range n {
					ex.write(b)
				}
				tin += mid.Sub(start)
				tex += time.Since(mid)
				done += n
			}
			b.StopTimer()
			mbps := func(d time.Duration) float64 { return float64(b.N) * 8192 / d.Seconds() / 1e6 }
			b.ReportMetric(mbps(tin), "MB/s-internal")
			b.ReportMetric(mbps(tex), "MB/s-external")
			b.ReportMetric(tex.Seconds()/tin.Seconds(), "internal/external")
			tx := in.md.ActivityLog().Stats().Transactions - warm
			b.ReportMetric(float64(tx)/float64(b.N), "AL-tx/write")
		})
	}
}

// BenchmarkActivityLogHotWrite is the activity log's cost on the write
// path when the extent is hot (every write of a steady workload but the
// first to each extent): Admit, then Done, with no metadata IO. A
// replicated write pays it on both nodes.
func BenchmarkActivityLogHotWrite(b *testing.B) {
	v := newBenchVolume(b, Internal, DefaultALExtents)
	al := v.md.ActivityLog()
	ctx := context.Background()
	const extents = 64
	for e := range int64(extents) { // make them hot
		if err := al.Admit(ctx, e*ExtentSize, 8192); err != nil {
			b.Fatal(err)
		}
		al.Done(e*ExtentSize, 8192)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		off := int64(i%extents)*ExtentSize + int64(i%512)*8192
		if err := al.Admit(ctx, off, 8192); err != nil {
			b.Fatal(err)
		}
		al.Done(off, 8192)
	}
	b.StopTimer()
	if tx := al.Stats().Misses; tx != extents {
		b.Fatalf("%d cold admissions, want only the %d of the warm-up", tx, extents)
	}
}
