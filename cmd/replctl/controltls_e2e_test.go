package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestE2ECertsInitWritesTheClusterPKI: replctl certs init on a cluster
// file writes the CA, every node's certificate and key, the operator's,
// the gossip key and the NBD client's files, keys mode 0600; it prints
// the tls: section to add, says what a wildcard address makes a
// certificate cover, and refuses to replace the CA without --force.
func TestE2ECertsInitWritesTheClusterPKI(t *testing.T) {
	e2e(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(cfg, []byte(`nodes:
  - {name: alpha, control: "10.0.0.1:7800", replication: "10.0.0.1:7801", nbd: "alpha.example:7802", raft: "10.0.0.1:7803", gossip: "10.0.0.1:7804", state_dir: /tmp/a}
  - {name: beta, control: "0.0.0.0:7800", replication: ":7801", nbd: "[::]:7802", raft: "10.0.0.2:7803", gossip: "10.0.0.2:7804", state_dir: /tmp/b}
  - {name: witness, role: witness, control: "10.0.0.3:7800", raft: "10.0.0.3:7803", gossip: "10.0.0.3:7804", state_dir: /tmp/w}
volumes:
  - {name: vol0, size: 1GiB, primary: alpha, disks: {alpha: /dev/sdb, beta: /dev/sdb}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	pki := filepath.Join(dir, "tls")
	r := runCmd(30*time.Second, nil, replctlBin, "certs", "init", "--config", cfg, "--dir", pki, "--host", "beta=beta.example")
	if !r.ok() {
		t.Fatalf("replctl certs init: %s", r)
	}
	for _, want := range []string{
		"alpha.crt, alpha.key", "node alpha, for 10.0.0.1, alpha.example",
		"node beta, for 10.0.0.2, localhost, 127.0.0.1, ::1, beta, beta.example",
		`note: node beta: control 0.0.0.0:7800, replication :7801, nbd [::]:7802 listen on every address`,
		"tls:\n  ca: " + filepath.Join(pki, "ca.crt") + "\n  cert: " + filepath.Join(pki, "{node}.crt"),
		"gossip_key: " + filepath.Join(pki, "gossip.key"),
		"replctl --tls-dir " + pki,
	} {
		if !strings.Contains(r.out, want) {
			t.Errorf("certs init's output lacks %q:\n%s", want, r.out)
		}
	}
	for _, f := range []string{"ca.crt", "ca.key", "alpha.crt", "alpha.key", "beta.crt", "beta.key", "witness.crt", "witness.key",
		"operator.crt", "operator.key", "gossip.key", "nbd-client/ca-cert.pem", "nbd-client/client-cert.pem", "nbd-client/client-key.pem"} {
		fi, err := os.Stat(filepath.Join(pki, f))
		if err != nil {
			t.Fatal(err)
		}
		if (strings.HasSuffix(f, ".key") || strings.HasSuffix(f, "-key.pem")) && fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	if fi, _ := os.Stat(filepath.Join(pki, "gossip.key")); fi.Size() != 32 {
		t.Errorf("gossip.key: %d bytes, want 32", fi.Size())
	}
	ca, _ := os.ReadFile(filepath.Join(pki, "ca.crt"))
	r = runCmd(30*time.Second, nil, replctlBin, "certs", "init", "--config", cfg, "--dir", pki)
	if r.ok() || r.code != 1 || !strings.Contains(r.out, "--force") {
		t.Fatalf("a second certs init without --force: %s", r)
	}
	if again, _ := os.ReadFile(filepath.Join(pki, "ca.crt")); string(again) != string(ca) {
		t.Fatal("the refused certs init replaced the CA")
	}
	if r := runCmd(30*time.Second, nil, replctlBin, "certs", "init", "--config", cfg, "--dir", pki, "--host", "gamma=10.0.0.9"); r.code != 2 || !strings.Contains(r.out, "alpha, beta, witness") {
		t.Fatalf("--host of a node not in the file: %s", r)
	}
	if r := runCmd(30*time.Second, nil, replctlBin, "certs", "init", "--config", cfg, "--dir", pki, "--force"); !r.ok() {
		t.Fatalf("certs init --force: %s", r)
	}
	if again, _ := os.ReadFile(filepath.Join(pki, "ca.crt")); string(again) == string(ca) {
		t.Fatal("certs init --force kept the old CA")
	}
}

// TestE2EATLSClusterIsCommandedWithTheOperatorsCertificate: two replnode
// processes started from replctl certs init's files and the tls: section.
// replctl --tls-dir reads the status (the nodes reached each other over
// TLS) and forwards a disconnect and a connect; REPLCTL_TLS_DIR does the
// same; replctl without certificates, with another cluster's, or with a
// node's certificate as the operator's, is refused with exit code 1 and
// words that say what to do; the unix socket needs no certificate (a
// SIGHUP applies the file's new protocol through it); the page is HTTPS
// and readable without one. Restarted with a second CA's files, beta is
// refused by alpha, whose status says why (error_code tls).
func TestE2EATLSClusterIsCommandedWithTheOperatorsCertificate(t *testing.T) {
	e2eBeside(t)
	c := newProcClusterN(t, clusterOpts{TLS: true})
	c.startAll()
	c.waitInSync("alpha")
	st, _, err := c.status("beta")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if !n.Alive {
			t.Fatalf("beta does not reach %s over TLS: %s", n.Name, n.Error)
		}
	}
	c.mustCtl("alpha", "disconnect", volName, "--node", "beta")
	c.waitFor("alpha", "beta StandAlone", syncTimeout, func(v *volumeStatus) bool {
		r := v.replica("beta")
		return r != nil && r.Replication == "StandAlone"
	})
	c.mustCtl("alpha", "connect", volName, "--node", "beta")
	c.waitInSync("alpha")

	alpha := c.nodes["alpha"].Control
	r := runCmd(30*time.Second, []string{"REPLCTL_TLS_DIR=" + c.tlsDir}, replctlBin, "status", "--addr", alpha)
	if !r.ok() || !strings.Contains(r.out, "UpToDate") {
		t.Fatalf("replctl status with REPLCTL_TLS_DIR: %s", r)
	}

	r = runCmd(30*time.Second, []string{"REPLCTL_TLS_DIR="}, replctlBin, "status", "--addr", alpha)
	// The unix socket it names is alpha's own (it named
	// /var/lib/replvol/control.sock whatever alpha's state directory).
	if r.code != 1 || !strings.Contains(r.out, "requires TLS") || !strings.Contains(r.out, "--tls-dir") || !strings.Contains(r.out, "use its unix socket (--addr "+c.socket("alpha")+")") {
		t.Fatalf("replctl status without certificates: %s; want it to name alpha's unix socket %s", r, c.socket("alpha"))
	}
	t.Logf("without certificates: %s", r.out)

	other := c.otherCA()
	r = runCmd(30*time.Second, nil, replctlBin, "status", "--addr", alpha, "--tls-dir", other)
	if r.code != 1 || !strings.Contains(r.out, "not signed by the CA this client trusts") || !strings.Contains(r.out, "is --tls-dir "+other+" this cluster's") {
		t.Fatalf("replctl status with another cluster's certificates: %s", r)
	}
	t.Logf("with another cluster's certificates: %s", r.out)

	// alpha's node certificate, presented as the operator's.
	asNode := c.nodeAsOperator("alpha")
	r = runCmd(30*time.Second, nil, replctlBin, "disconnect", volName, "--node", "beta", "--addr", alpha, "--tls-dir", asNode)
	if r.code != 1 || !strings.Contains(r.out, "the certificate of node alpha may not run Disconnect") {
		t.Fatalf("replctl disconnect with a node's certificate: %s", r)
	}
	t.Logf("with a node's certificate: %s", r.out)
	if r := runCmd(30*time.Second, nil, replctlBin, "status", "--addr", alpha, "--tls-dir", asNode); !r.ok() {
		t.Fatalf("replctl status with a node's certificate (nodes read each other's status): %s", r)
	}

	sock := c.socket("alpha")
	r = runCmd(30*time.Second, []string{"REPLCTL_TLS_DIR="}, replctlBin, "status", "--addr", sock)
	if !r.ok() || !strings.Contains(r.out, "UpToDate") {
		t.Fatalf("replctl status through the unix socket: %s", r)
	}
	if r := runCmd(30*time.Second, []string{"REPLCTL_TLS_DIR="}, replctlBin, "disconnect", volName, "--node", "beta", "--addr", sock); !r.ok() {
		t.Fatalf("replctl disconnect --node beta through alpha's unix socket: %s", r)
	}
	if r := runCmd(30*time.Second, []string{"REPLCTL_TLS_DIR="}, replctlBin, "connect", volName, "--node", "beta", "--addr", sock); !r.ok() {
		t.Fatalf("replctl connect --node beta through alpha's unix socket: %s", r)
	}
	c.waitInSync("alpha")

	// SIGHUP applies a file's new protocol through the node's own unix
	// socket: its TCP port would want a certificate.
	cfg, err := os.ReadFile(c.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.cfgPath, []byte(strings.Replace(string(cfg), "protocol: C", "protocol: B", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"alpha", "beta"} {
		if err := c.procs[name].Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	c.waitFor("alpha", "protocol B after SIGHUP", syncTimeout, func(v *volumeStatus) bool { return v.Protocol == "B" })

	resp, err := c.apiGet("alpha", "/api/status")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.TLS == nil || !strings.Contains(string(body), `"replicas"`) {
		t.Fatalf("/api/status over HTTPS without a certificate: %s %s", resp.Status, body)
	}
	for _, name := range []string{"alpha", "beta"} {
		log, _ := os.ReadFile(filepath.Join(c.dir, name+".log"))
		if strings.Contains(string(log), "level=ERROR") {
			t.Errorf("%s logged an error:\n%s", name, log)
		}
	}

	// beta restarted with a second CA's files: alpha refuses its control
	// port, says so in status, and logs it once.
	c.stop("beta")
	c.start("beta", "--config", c.configUsingTLSDir(other))
	c.waitListening("beta", 30*time.Second)
	var last string
	if !within(syncTimeout, 200*time.Millisecond, func() bool {
		st, _, err := c.status("alpha")
		if err != nil {
			t.Fatal(err)
		}
		var code, words string
		for _, n := range st.Nodes {
			if n.Name == "beta" {
				code, words = n.ErrorCode, n.Error
			}
		}
		if code == "tls" && strings.Contains(words, "no TLS with beta") && strings.Contains(words, "not signed by the CA this client trusts") {
			return true
		}
		last = code + ": " + words
		return false
	}) {
		t.Fatalf("alpha's status of beta with another CA's certificate: %s", last)
	}
	log, _ := os.ReadFile(filepath.Join(c.dir, "alpha.log"))
	if n := strings.Count(string(log), `msg="refused the control port of a node" node=alpha`); n != 1 {
		t.Fatalf("alpha logged beta's certificate %d times, want once:\n%s", n, log)
	}
}
