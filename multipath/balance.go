package multipath

import "sort"

// BalanceByGroup chooses the preferred path of each of many LUNs so that
// the preferred paths spread evenly over the groups (controllers or
// HBAs): the layout that beat active/active in seeds/000 (each LUN
// active/passive, the active paths split across the controllers). Callers
// use it by default when paths have groups.
//
// groups[l][i] is the group of path i of LUN l ("" when not given); the
// result holds, for each LUN, the index of its preferred path. LUNs with
// fewest groups are placed first; then any LUN whose group holds two more
// preferred paths than another group it can reach moves there, until none
// can. Within a group the choice alternates over the LUN's paths in it
// (e.g. over HBAs to one controller). It is pure and deterministic.
func BalanceByGroup(groups [][]string) []int {
	type lunInfo struct {
		distinct []string // the LUN's groups, in path order
	}
	luns := make([]lunInfo, len(groups))
	for l, gs := range groups {
		seen := map[string]bool{}
		for _, g := range gs {
			if !seen[g] {
				seen[g] = true
				luns[l].distinct = append(luns[l].distinct, g)
			}
		}
	}
	order := make([]int, len(groups))
	for l := range order {
		order[l] = l
	}
	sort.SliceStable(order, func(a, b int) bool {
		return len(luns[order[a]].distinct) < len(luns[order[b]].distinct)
	})

	load := map[string]int{}
	chosen := make([]string, len(groups))
	for _, l := range order {
		best := ""
		for k, g := range luns[l].distinct {
			if k == 0 || load[g] < load[best] {
				best = g
			}
		}
		if len(luns[l].distinct) > 0 {
			chosen[l] = best
			load[best]++
		}
	}
	for moved := true; moved; {
		moved = false
		for _, l := range order {
			from := chosen[l]
			for _, g := range luns[l].distinct {
				if load[g] < load[from]-1 {
					load[from]--
					load[g]++
					chosen[l], from, moved = g, g, true
				}
			}
		}
	}

	// Within a group, alternate over the LUN's k-th path in that group.
	type slot struct {
		group string
		k     int
	}
	used := map[slot]int{}
	preferred := make([]int, len(groups))
	for l, gs := range groups {
		var candidates []int
		for i, g := range gs {
			if g == chosen[l] {
				candidates = append(candidates, i)
			}
		}
		if len(candidates) == 0 {
			continue // a LUN without paths keeps 0
		}
		bestK := 0
		for k := range candidates {
			if used[slot{chosen[l], k}] < used[slot{chosen[l], bestK}] {
				bestK = k
			}
		}
		used[slot{chosen[l], bestK}]++
		preferred[l] = candidates[bestK]
	}
	return preferred
}
