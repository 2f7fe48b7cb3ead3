package poll

import "time"

// Within calls cond every interval until it holds or timeout has passed,
// and reports whether it held.
func Within(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
	return true
}
