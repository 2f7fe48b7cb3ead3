package main

// End-to-end tests of the config file as an operator meets it: a file
// with several problems, and a SIGHUP of one node's edited file.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replvol/replvol/transport"
)

// TestE2EBadConfigNamesEveryProblem: replnode refuses a file with several
// problems at once, one line per problem, each naming the file, the line
// and the field (an unknown key with the key meant), and creates nothing.
func TestE2EBadConfigNamesEveryProblem(t *testing.T) {
	e2e(t)
	bin := replnode(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.yaml")
	cfg := fmt.Sprintf(`nodes:
  - name: alpha
    control: 127.0.0.1:0
    replicaton: 127.0.0.1:0
    nbd: 127.0.0.1:0
  - {name: beta, control: 127.0.0.1:0, replication: 127.0.0.1:0}
volumes:
  - name: vol0
    size: lots
    protocol: C
    primary: alpha
    peer_timeout: forever
    disks: {alpha: %s, beta: %s}
`, filepath.Join(dir, "a.img"), filepath.Join(dir, "b.img"))
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", path, "--node", "alpha")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("replnode accepted a file with four problems: %s", out.String())
		}
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("replnode still running 15 s after a bad file: %s", out.String())
	}
	for _, want := range []string{
		path + `:4: nodes[0].replicaton: unknown key; did you mean "replication"?`,
		path + `:6: nodes[1].nbd: missing`,
		path + `:9: volumes[0].size: size "lots"`,
		path + `:12: volumes[0].peer_timeout: "forever"`,
	} {
		if !strings.Contains(out.String(), want+"") {
			t.Errorf("replnode's output lacks the line %q:\n%s", want, out.String())
		}
	}
	if n := strings.Count(strings.TrimSpace(out.String()), "\n") + 1; n != 4 {
		t.Errorf("%d lines for 4 problems:\n%s", n, out.String())
	}
	for _, img := range []string{"a.img", "b.img"} {
		if _, err := os.Stat(filepath.Join(dir, img)); err == nil {
			t.Errorf("replnode created %s although its config is invalid", img)
		}
	}
}

// TestE2EASIGHUPOfOneNodeIsAMismatch: the file is edited to protocol B and
// only beta gets the SIGHUP, while alpha, the primary, runs on with C.
// beta reports the difference as an event; status (JSON and text) names
// the setting and each node's value; replctl adjust to the primary's
// value ends it, and beta says so.
func TestE2EASIGHUPOfOneNodeIsAMismatch(t *testing.T) {
	e2eBeside(t)
	c := newProcCluster(t, 64<<20, 61)
	c.start("alpha")
	c.start("beta")
	c.waitListening("alpha", 30*time.Second)
	c.waitListening("beta", 30*time.Second)
	c.waitInSync("alpha")
	began := time.Now()

	orig, err := os.ReadFile(c.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(orig), "protocol: C,", "protocol: B,", 1)
	if edited == string(orig) {
		t.Fatalf("the harness's config changed shape:\n%s", orig)
	}
	if err := os.WriteFile(c.cfgPath, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.procs["beta"].Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	configWaitUntil(t, "beta runs protocol B", func() bool { return nodeProtocol(t, c.nodes["beta"].Control) == "B" })
	if err := os.WriteFile(c.cfgPath, orig, 0o644); err != nil { // alpha never reads the edit
		t.Fatal(err)
	}

	var e nodeEvent
	configWaitUntil(t, "beta's settings-mismatch event", func() bool {
		evs, err := c.eventsSince("beta", "settings-mismatch", began)
		if err == nil && len(evs) > 0 {
			e = evs[0]
		}
		return e.Kind != ""
	})
	if !strings.Contains(e.Message, "protocol is B on beta but C on alpha") || !strings.Contains(e.Message, "replctl adjust vol0 --protocol C") {
		t.Errorf("event %q: want both values and the fix", e.Message)
	}
	var st transport.ClusterStatus
	if err := json.Unmarshal([]byte(c.mustCtl("alpha", "status", "--json")), &st); err != nil {
		t.Fatal(err)
	}
	want := []transport.SettingMismatch{{Setting: "protocol", Values: map[string]string{"alpha": "C", "beta": "B"}, Primary: "C"}}
	if got := st.Volumes[0].SettingMismatches; !reflect.DeepEqual(got, want) {
		t.Fatalf("status --json: setting_mismatches %+v, want %+v", got, want)
	}
	if out := c.mustCtl("beta", "status"); !strings.Contains(out, "! protocol differs: alpha C, beta B") {
		t.Errorf("replctl status does not warn:\n%s", out)
	}

	c.mustCtl("alpha", "adjust", volName, "--protocol", "C")
	configWaitUntil(t, "beta's settings-agree event", func() bool {
		evs, err := c.eventsSince("beta", "settings-agree", began)
		return err == nil && len(evs) > 0
	})
	var after transport.ClusterStatus
	if err := json.Unmarshal([]byte(c.mustCtl("alpha", "status", "--json")), &after); err != nil || after.Volumes[0].SettingMismatches != nil {
		t.Fatalf("after the adjust: setting_mismatches %+v (%v)", after.Volumes[0].SettingMismatches, err)
	}
}

// configWaitUntil polls cond for up to 20 s.
func configWaitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !within(20*time.Second, 50*time.Millisecond, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}
