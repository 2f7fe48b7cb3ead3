package multipath

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/multipath/faultpath"
)

// BenchmarkChoose is the pure selector's cost per IO (goal: ≤ 1 µs, no
// allocation).
func BenchmarkChoose(b *testing.B) {
	for _, n := range []int{2, 4, 8} {
		for p := Failover; p <= ActiveRead; p++ {
			b.Run(fmt.Sprintf("%s/N=%d", p, n), func(b *testing.B) {
				paths := make([]PathView, n)
				for i := range paths {
					paths[i] = PathView{Group: i % 2, InFlight: i % 3, InFlightBytes: int64(i%3) << 16, Throughput: float64(i+1) * 1e8}
				}
				c := Choice{Policy: p, RRMinIO: DefaultRRMinIO, Size: 64 << 10}
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					c.Direction = Direction(i & 1)
					k := Choose(paths, &c)
					paths[k].InFlight ^= 1
					if k == c.Last {
						c.IOsOnLast++
					} else {
						c.Last, c.IOsOnLast = k, 1
					}
				}
			})
		}
	}
}

// BenchmarkPathChoice is the Device's whole per-IO path choice: lock,
// choose, count the IO in flight, and account its completion (in-flight,
// throughput EWMA, latency histogram, counters). Goal: ≤ 1 µs, no
// allocation.
func BenchmarkPathChoice(b *testing.B) {
	for _, n := range []int{2, 4, 8} {
		for _, p := range []Policy{Failover, RoundRobin, QueueLength, ServiceTime, ActiveRead} {
			b.Run(fmt.Sprintf("%s/N=%d", p, n), func(b *testing.B) {
				d, _, _ := memDevice(b, n, 1<<20, Config{Policy: p})
				defer d.Close()
				start := time.Now()
				b.ReportAllocs()
				for b.Loop() {
					ps, _, _, _ := d.pick(Read, 64<<10)
					d.finish(ps, opRead, 64<<10, nil, start, start)
				}
			})
		}
	}
	b.Run("service-time/N=4/parallel", func(b *testing.B) {
		d, _, _ := memDevice(b, 4, 1<<20, Config{Policy: ServiceTime})
		defer d.Close()
		start := time.Now()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				ps, _, _, _ := d.pick(Read, 64<<10)
				d.finish(ps, opRead, 64<<10, nil, start, start)
			}
		})
	})
}

// BenchmarkDeviceIO is a whole 4 KiB IO through a Device over in-memory
// paths: choice, hand-off to the path's worker, the timeout timer, the
// private buffer copy, and accounting.
func BenchmarkDeviceIO(b *testing.B) {
	for _, op := range []string{"read", "write"} {
		b.Run(op+"/4KiB/parallel", func(b *testing.B) {
			d, _, _ := memDevice(b, 2, 1<<20, Config{Policy: ServiceTime})
			defer d.Close()
			b.SetBytes(4096)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				buf := make([]byte, 4096)
				for pb.Next() {
					var err error
					if op == "read" {
						_, err = d.ReadAt(buf, 0)
					} else {
						_, err = d.WriteAt(buf, 0)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

const (
	pathRate  = 100e6 // bytes/s each throttled path carries
	benchIO   = 128 << 10
	benchSize = 32<<20 + LabelSize
)

// throttled opens a Device over paths limited to rates (bytes/s).
func throttled(b *testing.B, cfg Config, rates ...float64) (*Device, []*faultpath.Path) {
	d, fps, _ := memDevice(b, len(rates), benchSize, cfg)
	for i, r := range rates {
		fps[i].SetRate(int64(r))
	}
	return d, fps
}

// reader streams sequential reads of benchIO bytes through d from depth
// goroutines, counting the bytes read.
type reader struct {
	d     *Device
	next  atomic.Int64
	bytes atomic.Int64
	stop  chan struct{}
	wg    sync.WaitGroup
}

func startReader(b *testing.B, d *Device, depth int, limit int64) *reader {
	r := &reader{d: d, stop: make(chan struct{})}
	blocks := d.Size() / benchIO
	for range depth {
		r.wg.Go(func() {
			buf := make([]byte, benchIO)
			for {
				select {
				case <-r.stop:
					return
				default:
				}
				i := r.next.Add(1) - 1
				if limit > 0 && i >= limit {
					return
				}
				if _, err := d.ReadAt(buf, i%blocks*benchIO); err != nil {
					b.Error(err)
					return
				}
				r.bytes.Add(benchIO)
			}
		})
	}
	return r
}

func (r *reader) halt() {
	close(r.stop)
	r.wg.Wait()
}

// readRate reads b.N blocks through d and returns bytes/s.
func readRate(b *testing.B, d *Device, depth int) float64 {
	b.SetBytes(benchIO)
	start := time.Now()
	r := startReader(b, d, depth, int64(b.N))
	r.wg.Wait()
	return float64(r.bytes.Load()) / time.Since(start).Seconds()
}

type benchPolicy struct {
	name    string
	policy  Policy
	rrMinIO int
	depth   int // IOs in flight per path
}

var balancing = []benchPolicy{
	{"round-robin", RoundRobin, DefaultRRMinIO, 2 * DefaultRRMinIO},
	{"round-robin-rr_min_io=1", RoundRobin, 1, 8},
	{"queue-length", QueueLength, 0, 8},
	{"service-time", ServiceTime, 0, 8},
}

// BenchmarkSequentialRead: N paths of 100 MB/s each; goal ≥ 0.9 × N × one
// path (metric x-capacity ≥ 0.9). rr_min_io=100 needs ~2×100 IOs in
// flight per path to keep every path busy: it moves the stream in runs
// of 100 IOs.
func BenchmarkSequentialRead(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, p := range balancing {
			b.Run(fmt.Sprintf("%s/N=%d/depth=%d", p.name, n, p.depth*n), func(b *testing.B) {
				rates := make([]float64, n)
				for i := range rates {
					rates[i] = pathRate
				}
				d, _ := throttled(b, Config{Policy: p.policy, RRMinIO: p.rrMinIO}, rates...)
				defer d.Close()
				rate := readRate(b, d, p.depth*n)
				b.ReportMetric(rate/(float64(n)*pathRate), "x-capacity")
			})
		}
	}
}

// BenchmarkSlowPath: one path of 100 MB/s and one of 25 MB/s; goal ≥ 0.9
// × the sum for the load-aware policies (round-robin gives each path the
// same share, so it cannot).
func BenchmarkSlowPath(b *testing.B) {
	for _, p := range balancing {
		b.Run(fmt.Sprintf("%s/depth=%d", p.name, 2*p.depth), func(b *testing.B) {
			d, _ := throttled(b, Config{Policy: p.policy, RRMinIO: p.rrMinIO}, pathRate, pathRate/4)
			defer d.Close()
			rate := readRate(b, d, 2*p.depth)
			b.ReportMetric(rate/(pathRate*5/4), "x-capacity")
		})
	}
}

// BenchmarkLoseOnePath: N paths of 100 MB/s under sequential reads; one
// path starts failing every IO. Goal: in the first second after, the
// device delivers ≥ 0.9 × (N−1)/N of what it did before (metric
// x-expected ≥ 0.9). One measurement of ~1.5 s per run, whatever b.N.
func BenchmarkLoseOnePath(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, p := range balancing {
			b.Run(fmt.Sprintf("%s/N=%d", p.name, n), func(b *testing.B) {
				rates := make([]float64, n)
				for i := range rates {
					rates[i] = pathRate
				}
				d, fps := throttled(b, Config{Policy: p.policy, RRMinIO: p.rrMinIO}, rates...)
				defer d.Close()
				r := startReader(b, d, p.depth*n, 0)
				time.Sleep(250 * time.Millisecond) // warm up: throughput estimates settle
				b0 := r.bytes.Load()
				time.Sleep(250 * time.Millisecond)
				before := float64(r.bytes.Load()-b0) / 0.25
				fps[0].SetInjector(faultpath.Always(faultpath.Fault{Err: syscall.EIO}))
				b1 := r.bytes.Load()
				time.Sleep(time.Second)
				after := float64(r.bytes.Load() - b1)
				r.halt()
				if d.Paths()[0].State != Fail {
					b.Fatal("the failing path is not FAIL")
				}
				b.ReportMetric(after/(before*float64(n-1)/float64(n)), "x-expected")
				b.ReportMetric(before/1e6, "MB/s-before")
				b.ReportMetric(after/1e6, "MB/s-after")
			})
		}
	}
}
