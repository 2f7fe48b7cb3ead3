package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReplnodeNamesEveryProblemOfItsFileAtOnce: a file whose tls: section
// names files that are not there, and with a problem of its own, is
// refused with every problem at once, each with its file and line, and
// the missing files with the command that writes them (replnode said
// only "node alpha: tls: CA certificate: open ...: no such file or
// directory", and only once every other problem was fixed).
func TestReplnodeNamesEveryProblemOfItsFileAtOnce(t *testing.T) {
	dir := t.TempDir()
	tlsDir := filepath.Join(dir, "tls")
	path := filepath.Join(dir, "cluster.yaml")
	text := `nodes:
  - {name: alpha, control: "127.0.0.1:0", replication: "127.0.0.1:0", nbd: "127.0.0.1:0", state_dir: ` + dir + `/alpha}
tls:
  ca: ` + tlsDir + `/ca.crt
  cert: ` + tlsDir + `/{node}.crt
  key: ` + tlsDir + `/{node}.key
volumes:
  - {name: vol0, size: 1GiB, primary: alpha, protocl: C, disks: {alpha: ` + dir + `/alpha.img}}
`
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"--config", path, "--node", "alpha"}, &out, &errOut); code != 1 {
		t.Fatalf("replnode exited %d, want 1; it said:\n%s", code, errOut.String())
	}
	got := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	init := "run replctl certs init --config " + path + " --dir " + tlsDir + " on one host"
	want := []string{
		"replnode: " + path + ":4: tls.ca: the CA certificate " + tlsDir + "/ca.crt: no such file: " + init,
		path + ":5: tls.cert: alpha's certificate " + tlsDir + "/alpha.crt: no such file: " + init,
		path + ":6: tls.key: alpha's key " + tlsDir + "/alpha.key: no such file: " + init,
		path + `:8: volumes[0].protocl: unknown key; did you mean "protocol"?`,
	}
	if len(got) != len(want) {
		t.Fatalf("replnode said %d lines, want %d:\n%s", len(got), len(want), errOut.String())
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Fatalf("line %d:\n%s\nwant it to start with\n%s", i+1, got[i], want[i])
		}
	}
}
