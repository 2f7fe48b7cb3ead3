package main

import (
	"time"

	"github.com/replvol/replvol/internal/poll"
)

// within calls cond every interval until it holds or timeout has passed, and
// reports whether it held.
//
// It is the package's one polling loop: every wait for a condition of the
// processes under test goes through it, directly or through the helpers
// built on it (configWaitUntil, bgCmd.waitFor, demo.waitForEvery,
// waitNodeAlive), and states what it waits for in cond and what a timeout
// means in its caller's failure message.
func within(timeout, interval time.Duration, cond func() bool) bool {
	return poll.Within(timeout, interval, cond)
}
