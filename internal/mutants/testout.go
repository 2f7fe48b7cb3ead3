package main

import (
	"fmt"
	"regexp"
	"strings"
)

// testFailLine is the first line of the report of a failed test's own
// log (testing's "    file_test.go:N: message").
var testFailLine = regexp.MustCompile(`(?m)^\s+(\S+_test\.go:\d+: .*)$`)

// parseTestOutput reads go test's output of one test (-run '^name$') and
// its exit: passed, failed (with the first line it logged, "" when none),
// or broken (the build failed, a timeout, no test of that name ran).
func parseTestOutput(name, out string, exitOK bool) (Outcome, string, error) {
	if exitOK {
		if strings.Contains(out, "no tests to run") {
			return Broken, "", fmt.Errorf("no test %s ran: the package has none of that name", name)
		}
		return Passed, "", nil
	}
	failed := regexp.MustCompile(`(?m)^\s*--- FAIL: ` + regexp.QuoteMeta(name) + `[ /]`)
	at := failed.FindStringIndex(out)
	if at == nil {
		return Broken, "", fmt.Errorf("go test failed without %s failing:\n%s", name, indent(tail(out, 25)))
	}
	// The test's log follows its --- FAIL line (go test without -v).
	if m := testFailLine.FindStringSubmatch(out[at[1]:]); m != nil {
		return Failed, strings.TrimSpace(m[1]), nil
	}
	if m := testFailLine.FindStringSubmatch(out); m != nil {
		return Failed, strings.TrimSpace(m[1]), nil
	}
	return Failed, "", nil
}
