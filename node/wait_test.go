package node

import "time"

// within calls cond every interval until it holds or timeout has passed, and
// reports whether it held. It is the package's one polling loop: eventually,
// waitInSync, waitVolumeInSync and waitMetric wait through it, each stating
// what it waits for and what a timeout means.
func within(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
	return true
}
