package main

// End-to-end tests of replctl for scripts and operators (issue 15): exit
// codes by class, the current state first in replctl events, shell
// completion from the cluster, and messages that name the right flag.

import (
	"path/filepath"
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
