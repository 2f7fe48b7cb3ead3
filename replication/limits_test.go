package replication

import "testing"

// TestCoarsenRunsFillsTheSmallestGaps: a list of block runs too long for
// a handshake becomes at most max runs by filling the smallest gaps
// first; every block marked stays marked (a block too many is resynced
// once more, never missed).
func TestCoarsenRunsFillsTheSmallestGaps(t *testing.T) {
	for _, tc := range []struct {
		name string
		runs [][2]int64
		max  int
		want [][2]int64
	}{
		{"short enough: unchanged", [][2]int64{{0, 1}, {5, 2}}, 2, [][2]int64{{0, 1}, {5, 2}}},
		{"the smallest gap is filled", [][2]int64{{0, 1}, {10, 1}, {12, 1}}, 2, [][2]int64{{0, 1}, {10, 3}}},
		{"equal gaps: the first ones", [][2]int64{{0, 1}, {2, 1}, {4, 1}, {6, 1}}, 2, [][2]int64{{0, 5}, {6, 1}}},
		{"down to one run", [][2]int64{{3, 1}, {100, 4}}, 1, [][2]int64{{3, 101}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CoarsenRuns(tc.runs, tc.max)
			if len(got) != len(tc.want) {
				t.Fatalf("CoarsenRuns(%v, %d) = %v, want %v", tc.runs, tc.max, got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("CoarsenRuns(%v, %d) = %v, want %v", tc.runs, tc.max, got, tc.want)
				}
			}
		})
	}
	// Many scattered runs: at most max, ascending, covering each one.
	var runs [][2]int64
	for b := int64(0); len(runs) < 5000; b += 1 + (b*7919)%13 {
		n := 1 + b%3
		runs = append(runs, [2]int64{b, n})
		b += n
	}
	got := CoarsenRuns(runs, 700)
	if len(got) != 700 {
		t.Fatalf("%d runs, want 700", len(got))
	}
	j := 0
	for _, r := range runs {
		for j < len(got) && got[j][0]+got[j][1] <= r[0] {
			j++
		}
		if j == len(got) || got[j][0] > r[0] || got[j][0]+got[j][1] < r[0]+r[1] {
			t.Fatalf("run %v is not covered by the coarse runs", r)
		}
	}
	for i := 1; i < len(got); i++ {
		if got[i][0] <= got[i-1][0]+got[i-1][1] {
			t.Fatalf("coarse runs %v and %v overlap or touch", got[i-1], got[i])
		}
	}
}

// TestTheLongestBatchFitsTheFrameLimit: a batch of one entry of the
// largest length is exactly MaxFrameLen, the limit both ends of the
// stream enforce.
func TestTheLongestBatchFitsTheFrameLimit(t *testing.T) {
	e := Entry{Op: OpWrite, Seq: 1, Data: make([]byte, MaxEntryLength)}
	frame := AppendEntry(AppendBatchHeader(nil, 1), &e)
	if len(frame) != MaxFrameLen {
		t.Fatalf("the longest batch is %d bytes, MaxFrameLen %d", len(frame), MaxFrameLen)
	}
	if _, err := DecodeBatch(frame, nil); err != nil {
		t.Fatal(err)
	}
}
