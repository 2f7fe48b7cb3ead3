package multipath

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// histogram counts latencies in fixed buckets: 8 per power of two of
// 1.024 µs units, so a quantile is within 12.5% of the truth. Record is
// one atomic add; it never allocates.
type histogram struct {
	counts [histBuckets]atomic.Uint64
}

const (
	histSubBits = 3
	histSub     = 1 << histSubBits
	histBuckets = histSub + (40-histSubBits)*histSub // up to 2^40 µs units, far past any IO timeout
)

func histBucket(d time.Duration) int {
	if d < 0 {
		d = 0
	}
	v := uint64(d) >> 10
	if v < histSub {
		return int(v)
	}
	exp := bits.Len64(v) - 1 // ≥ histSubBits
	mant := int(v>>(exp-histSubBits)) & (histSub - 1)
	b := histSub + (exp-histSubBits)*histSub + mant
	return min(b, histBuckets-1)
}

// histUpper is the largest latency bucket b holds.
func histUpper(b int) time.Duration {
	if b < histSub {
		return time.Duration(uint64(b+1)<<10 - 1)
	}
	exp := (b-histSub)/histSub + histSubBits
	mant := uint64((b - histSub) % histSub)
	return time.Duration((histSub+mant+1)<<(exp-histSubBits)<<10 - 1)
}

func (h *histogram) record(d time.Duration) { h.counts[histBucket(d)].Add(1) }

// quantile returns an upper bound of the q-quantile (0 < q ≤ 1) of the
// recorded latencies, 0 when none were recorded.
func (h *histogram) quantile(q float64) time.Duration {
	var snap [histBuckets]uint64
	var total uint64
	for i := range h.counts {
		snap[i] = h.counts[i].Load()
		total += snap[i]
	}
	if total == 0 {
		return 0
	}
	target := uint64(q*float64(total) + 0.999999)
	target = max(target, 1)
	var seen uint64
	for i, c := range snap {
		seen += c
		if seen >= target {
			return histUpper(i)
		}
	}
	return histUpper(histBuckets - 1)
}
