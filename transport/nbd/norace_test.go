//go:build !race

package nbd_test

// raceEnabled: the race detector shadows memory, so resident memory says little then.
const raceEnabled = false
