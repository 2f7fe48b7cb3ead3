//go:build race

package web

// raceEnabled: the race detector slows the code several times.
const raceEnabled = true
