package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// csiSanity is the csi-sanity binary of kubernetes-csi/csi-test (deploy/install-test-deps.sh
// installs it with go install): on $PATH or in Go's bin directory.
func csiSanity(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("csi-sanity"); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, dir := range filepath.SplitList(strings.TrimSpace(string(out))) {
			if p := filepath.Join(dir, "bin", "csi-sanity"); fileExists(p) {
				return p
			}
		}
	}
	missing(t, "csi-sanity not found: install it (go install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@v5.6.0, as ./deploy/install-test-deps.sh does)")
	return ""
}

// TestE2ECSISanity runs csi-sanity, the CSI conformance suite, against replcsi over a real
// three-node cluster (alpha and beta with a pool each, a witness), every spec the driver's
// capabilities turn on: identity, controller (create, delete, list, capacity, expand,
// validate) and node (stage, publish, stats, expand, the whole lifecycle, idempotent).
// Volumes are 16 MiB (the default 10 GiB would not fit a test's pool) and grow to 32 MiB.
func TestE2ECSISanity(t *testing.T) {
	e2e(t)
	needNodeTools(t)
	sanity := csiSanity(t)
	t.Parallel()
	c := startCluster(t, true)
	top := sharedTop(t)
	h := startCSI(t, "sanity-host", c.control["alpha"], top)
	report := filepath.Join(t.TempDir(), "csi-sanity.log")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, sanity,
		"--csi.endpoint", h.endpoint,
		"--csi.mountdir", filepath.Join(top, "csi-mount"),
		"--csi.stagingdir", filepath.Join(top, "csi-staging"),
		"--csi.testvolumesize", "16777216",
		"--csi.testvolumeexpandsize", "33554432",
		"--ginkgo.no-color",
		"--ginkgo.timeout", "19m",
	)
	log, err := os.Create(report)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	err = cmd.Run()
	b, _ := os.ReadFile(report)
	if err != nil {
		t.Fatalf("csi-sanity failed (%v):\n%s", err, summary(string(b)))
	}
	t.Logf("csi-sanity: %s", lastLine(string(b), "Ran "))
}

// summary is csi-sanity's report of failures: why each failed (its [FAILED] lines and the
// two after them) and what follows "Summarizing"; else the report's end.
func summary(out string) string {
	i := strings.LastIndex(out, "Summarizing")
	if i < 0 {
		return tail(out, 80)
	}
	var why []string
	lines := strings.Split(out[:i], "\n")
	for j, l := range lines {
		if strings.Contains(l, "[FAILED]") {
			why = append(why, lines[j:min(j+3, len(lines))]...)
		}
	}
	return strings.Join(why, "\n") + "\n" + out[i:]
}

// lastLine is the last line of out that starts with prefix.
func lastLine(out, prefix string) string {
	lines := strings.Split(out, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], prefix) {
			return lines[i]
		}
	}
	return ""
}
