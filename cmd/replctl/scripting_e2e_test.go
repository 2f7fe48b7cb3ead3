package main

// End-to-end tests of replctl for scripts and operators (issue 15): exit
// codes by class, the current state first in replctl events, shell
// completion from the cluster, and messages that name the right flag.

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestE2ECreateMDNamesTheFlagsThatOverwrite: create-md over existing
// metadata names the flags that discard it (--force --yes), not an
// internal option, and --force alone asks for --yes.
func TestE2ECreateMDNamesTheFlagsThatOverwrite(t *testing.T) {
	e2e(t)
	c := newProcCluster(t, 8<<20, 61)
	args := []string{"create-md", volName, "--config", c.cfgPath, "--node", "alpha", "--state-dir", filepath.Join(c.dir, "alpha")}
	if r := runCmd(30*time.Second, nil, replctlBin, args...); !r.ok() {
		t.Fatalf("create-md on a blank disk: %s", r)
	}
	r := runCmd(30*time.Second, nil, replctlBin, args...)
	want := "run replctl create-md vol0 --config " + c.cfgPath + " --node alpha --state-dir " + filepath.Join(c.dir, "alpha") + " --force --yes"
	if r.code != 1 || !strings.Contains(r.out, "metadata already exists") || !strings.Contains(r.out, want) || strings.Contains(r.out, "overwrite (") {
		t.Errorf("create-md over existing metadata: %s; want exit 1 and %q", r, want)
	}
	r = runCmd(30*time.Second, nil, replctlBin, append(args, "--force")...)
	if r.code != 1 || !strings.Contains(r.out, "add --yes to go ahead") {
		t.Errorf("create-md --force without --yes: %s", r)
	}
}

// TestE2EEventsStartWithTheCurrentState: replctl events without --since
// prints the node's current state first, as drbdsetup events2 does (a line
// of kind exists for the node, the volume with its role and each peer with
// its replication state, then exists-end), then what happens, in the text
// and in --json. No event line shows an empty old state or a raw byte
// count.
func TestE2EEventsStartWithTheCurrentState(t *testing.T) {
	e2e(t)
	d := startDemo(t)
	d.waitInSync("alpha")
	js := startBG(t, nil, "events", "--json", "--addr", d.nodes["alpha"].Control)
	text := startBG(t, []string{"NO_COLOR=1"}, "events", "--addr", d.nodes["alpha"].Control)
	js.waitFor("the state and its end", 15*time.Second, func() bool { return strings.Contains(js.out(), `"kind":"exists-end"`) })
	text.waitFor("the state and its end", 15*time.Second, func() bool { return strings.Contains(text.out(), "exists-end") })

	evs := eventLines(t, js.out())
	var kinds []string
	for _, e := range evs {
		kinds = append(kinds, e["kind"].(string)+"/"+e["volume"].(string)+"/"+e["peer"].(string)+"/"+e["new"].(string))
	}
	if want := "exists///|exists/vol0//Primary|exists/vol0/beta/Connected|exists-end///"; strings.Join(kinds, "|") != want {
		t.Fatalf("events --json began with %v, want %s", kinds, want)
	}
	lines := strings.Split(strings.TrimSpace(text.out()), "\n")
	if len(lines) != 4 || !strings.Contains(lines[1], "vol0     exists          Primary: disk UpToDate") ||
		!strings.Contains(lines[2], "exists          peer beta: Connected: peer disk UpToDate, 0B out of sync") {
		t.Fatalf("events began with:\n%s", text.out())
	}

	d.mustCtl("alpha", "disconnect", volName, "--node", "beta")
	d.mustCtl("alpha", "connect", volName, "--node", "beta")
	d.waitInSync("alpha")
	text.waitFor("the reconnect", 15*time.Second, func() bool { return strings.Contains(text.out(), " connected ") })
	rawBytes := regexp.MustCompile(`\d{4,} bytes`)
	for _, l := range strings.Split(text.out(), "\n") {
		if strings.Contains(l, ":  ->") || strings.Contains(l, ": -> ->") || rawBytes.MatchString(l) {
			t.Errorf("an event line with an empty old state or raw bytes: %q", l)
		}
	}
	for _, b := range []*bgCmd{js, text} {
		if code := b.interrupt(); code != 0 {
			t.Errorf("replctl %s: exit %d after Ctrl-C", b.name, code)
		}
	}
}

// TestE2ECompletionFromTheCluster: shell completion asks the cluster at
// --addr for volume, node and path names, as kubectl completes resources:
// replctl __complete primary vol0 --node "" lists the volume's nodes.
func TestE2ECompletionFromTheCluster(t *testing.T) {
	e2eBeside(t)
	d := startDemo(t, "--paths", "2")
	d.waitInSync("alpha")
	addr := d.nodes["alpha"].Control
	complete := func(args ...string) string {
		t.Helper()
		r := runCmd(30*time.Second, nil, replctlBin, append([]string{"__complete", "--addr", addr}, args...)...)
		if !r.ok() {
			t.Fatalf("replctl __complete %s: %s", strings.Join(args, " "), r)
		}
		var words []string
		for _, l := range strings.Split(r.out, "\n") {
			if l == "" || strings.HasPrefix(l, ":") || strings.HasPrefix(l, "Completion ended") {
				continue
			}
			words = append(words, strings.SplitN(l, "\t", 2)[0])
		}
		return strings.Join(words, " ")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"primary", "vol0", "--node", ""}, "alpha beta"},
		{[]string{"primary", "vol0", "--node", "b"}, "beta"},
		{[]string{"primary", ""}, "vol0"},
		{[]string{"status", "v"}, "vol0"},
		{[]string{"connect", "vol0", "--node", ""}, "alpha beta"},
		{[]string{"resync", "vol0", "--from", ""}, "alpha beta"},
		{[]string{"events", "--node", ""}, "alpha beta"},
		{[]string{"path", "fail", "--node", "beta", "vol0", ""}, "p0 p1"},
		{[]string{"path", "fail", "vol0", "p0", ""}, ""},
	} {
		if got := complete(tc.args...); got != tc.want {
			t.Errorf("replctl __complete %s: %q, want %q", strings.Join(tc.args, " "), got, tc.want)
		}
	}
	// The shell scripts themselves are cobra's.
	if out := d.mustCtl("alpha", "completion", "bash"); !strings.Contains(out, "__complete") {
		t.Errorf("replctl completion bash does not call __complete:\n%.300s", out)
	}
}
