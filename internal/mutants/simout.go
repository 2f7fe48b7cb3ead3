package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// SimFailure is the first invariant the simulation found broken, as
// TestSim prints it (node/sim's Failure and report).
type SimFailure struct {
	Invariant string
	Seed      uint64
	Step      int
	At        string
	Detail    string
	// Replay is the sim's own replay command (without the mutation).
	Replay string
}

// failureLine is node/sim's Failure.Error: "seed S step N (t=T): invariant
// I broken: DETAIL".
var (
	failureLine = regexp.MustCompile(`seed (\d+) step (\d+) \(t=([^)]*)\): invariant (\S+) broken: (.*)`)
	replayLine  = regexp.MustCompile(`replay: (go test .*)`)
)

// Outcome is what one run of the simulation said.
type Outcome int

const (
	// Passed: every seed held every invariant.
	Passed Outcome = iota
	// Failed: a seed broke an invariant (Failure says which).
	Failed
	// Broken: go test failed without an invariant broken (the build
	// failed, a panic, a timeout): no verdict on the mutation.
	Broken
)

// parseSimOutput reads go test's output of TestSim and its exit: passed,
// an invariant broken (the first the output reports), or broken.
func parseSimOutput(out string, exitOK bool) (Outcome, *SimFailure, error) {
	m := failureLine.FindStringSubmatch(out)
	if m == nil {
		if exitOK {
			return Passed, nil, nil
		}
		return Broken, nil, fmt.Errorf("go test failed without a broken invariant:\n%s", indent(tail(out, 25)))
	}
	if exitOK {
		// The sim reports a failure only through t.Fatal.
		return Broken, nil, fmt.Errorf("go test passed though its output reports an invariant broken (%s)", strings.TrimSpace(m[0]))
	}
	seed, err := strconv.ParseUint(m[1], 10, 64)
	if err != nil {
		return Broken, nil, fmt.Errorf("seed %q: %w", m[1], err)
	}
	step, err := strconv.Atoi(m[2])
	if err != nil {
		return Broken, nil, fmt.Errorf("step %q: %w", m[2], err)
	}
	f := &SimFailure{Seed: seed, Step: step, At: m[3], Invariant: m[4], Detail: strings.TrimSpace(m[5])}
	if r := replayLine.FindStringSubmatch(out); r != nil {
		f.Replay = strings.TrimSpace(r[1])
	}
	return Failed, f, nil
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
