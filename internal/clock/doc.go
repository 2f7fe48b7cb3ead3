// Package clock is the time source of the timing rules of node, cluster and
// multipath: a Clock reads the time and makes timers and tickers. Real is
// the time package; a Fake moves only when a test advances it, and fires the
// timers that fall due in the order of their deadlines, so that a test of a
// timing rule waits on the rule's events instead of sleeping for them.
//
// Code that keeps time takes a Clock (never nil: Real by default) where its
// rule lives and calls its methods instead of time.Now, time.Since,
// time.Until, time.NewTimer and time.NewTicker. Where a test is goroutines
// and timers with no real network, testing/synctest is the simpler choice:
// it virtualises the time package itself, Real included.
//
// A Fake's mutex is a leaf (internal/lockorder's): its timers fire by a
// send that never blocks, and no callback runs under it; code that holds
// its own mutex may read the Fake.
package clock
