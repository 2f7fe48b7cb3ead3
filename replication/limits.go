package replication

import "slices"

// MaxFrameLen bounds every frame of the replication stream, and both ends
// refuse a longer message. The longest legitimate frame is a batch of one
// entry of MaxEntryLength: a sender batches small entries up to a size
// below it, and puts an entry larger than that alone in its frame. Read
// replies carry at most MaxEntryLength of data, and handshakes at most
// MaxHandshakeRuns runs per list.
const MaxFrameLen = BatchHeaderLen + entryHeaderLen + MaxEntryLength

// MaxHandshakeRuns bounds each list of block runs a HelloReply carries
// (Changed, Discard): a longer list is coarsened (CoarsenRuns), so that
// the reply stays well within MaxFrameLen whatever the bitmap holds (a
// run is at most 42 bytes of JSON: two lists take at most 22 MB).
const MaxHandshakeRuns = 1 << 18

// CoarsenRuns returns runs ([first, count] of blocks, ascending and
// disjoint) as at most max runs that cover every block of runs: the
// smallest gaps between runs are filled in. A block marked too many is
// copied once more by a resync, never missed. runs itself is returned
// when it is short enough.
func CoarsenRuns(runs [][2]int64, max int) [][2]int64 {
	if len(runs) <= max || max < 1 {
		return runs
	}
	gaps := make([]int64, len(runs)-1)
	for i := range gaps {
		gaps[i] = runs[i+1][0] - (runs[i][0] + runs[i][1])
	}
	sorted := slices.Clone(gaps)
	slices.Sort(sorted)
	// Fill every gap below the threshold, and gaps equal to it while
	// too many runs are left.
	merges := len(runs) - max
	threshold := sorted[merges-1]
	equal := merges
	for _, g := range sorted[:merges] {
		if g < threshold {
			equal--
		}
	}
	out := make([][2]int64, 0, max)
	cur := runs[0]
	for i, g := range gaps {
		next := runs[i+1]
		if g < threshold || (g == threshold && equal > 0) {
			if g == threshold {
				equal--
			}
			cur[1] = next[0] + next[1] - cur[0]
			continue
		}
		out = append(out, cur)
		cur = next
	}
	return append(out, cur)
}
