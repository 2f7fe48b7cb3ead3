package multipath

import (
	"fmt"
	"slices"
	"testing"
)

// TestBalanceByGroup pins the layout seeds/000 found fastest: each LUN's
// preferred path on a controller, the LUNs split evenly over the
// controllers, never more than one apart.
func TestBalanceByGroup(t *testing.T) {
	repeat := func(n int, gs ...string) [][]string {
		out := make([][]string, n)
		for i := range out {
			out[i] = gs
		}
		return out
	}
	tests := []struct {
		name   string
		groups [][]string
		want   []int // nil: only check the spread
	}{
		{"two LUNs on two controllers take one each", repeat(2, "A", "B"), []int{0, 1}},
		{"the seed's 24 LUNs alternate over two controllers", repeat(24, "A", "B"), nil},
		{"three controllers", repeat(9, "A", "B", "C"), nil},
		{"the choice follows groups, not path order", [][]string{{"A", "B"}, {"B", "A"}, {"A", "B"}, {"B", "A"}}, []int{0, 0, 0, 0}},
		{"a LUN reachable through one controller only is placed first",
			[][]string{{"A", "B"}, {"A"}}, []int{1, 0}},
		{"a chain of constraints still balances",
			[][]string{{"A", "B"}, {"B", "C"}, {"C"}, {"C"}}, nil},
		{"two HBAs to each controller alternate within the controller",
			repeat(4, "A", "A", "B", "B"), []int{0, 2, 1, 3}},
		{"without groups the preferred paths spread over the paths", repeat(4, "", ""), []int{0, 1, 0, 1}},
		{"no LUNs", nil, []int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := BalanceByGroup(tt.groups)
			if len(got) != len(tt.groups) {
				t.Fatalf("%d choices for %d LUNs", len(got), len(tt.groups))
			}
			if tt.want != nil && !slices.Equal(got, tt.want) {
				t.Errorf("BalanceByGroup = %v, want %v", got, tt.want)
			}
			load := map[string]int{}
			for l, i := range got {
				if i < 0 || i >= len(tt.groups[l]) {
					t.Fatalf("LUN %d: path %d of %d", l, i, len(tt.groups[l]))
				}
				load[tt.groups[l][i]]++
			}
			if spread := maxLoad(load) - minLoad(load, tt.groups, maxLoad(load)); spread > 1 {
				t.Errorf("preferred paths per group %v: spread %d, want at most 1", load, spread)
			}
		})
	}
}

func maxLoad(load map[string]int) int {
	m := 0
	for _, n := range load {
		m = max(m, n)
	}
	return m
}

// minLoad is the least load of the groups of LUNs that have a choice of
// groups; none when no LUN has a choice.
func minLoad(load map[string]int, groups [][]string, none int) int {
	m := -1
	for _, gs := range groups {
		if len(slices.Compact(slices.Sorted(slices.Values(gs)))) < 2 {
			continue
		}
		for _, g := range gs {
			if m < 0 || load[g] < m {
				m = load[g]
			}
		}
	}
	if m < 0 {
		return none
	}
	return m
}

func ExampleBalanceByGroup() {
	// Four LUNs, each with a path through controller A and one through B.
	fmt.Println(BalanceByGroup([][]string{{"A", "B"}, {"A", "B"}, {"A", "B"}, {"A", "B"}}))
	// Output: [0 1 0 1]
}
