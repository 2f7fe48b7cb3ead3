package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestE2EACertifiedClusterAdmitsOnlyItsOwn: two data nodes and a witness,
// raft and gossip, started from `replctl certs init`'s files and a tls:
// section with nbd: required. Every link is mutual TLS: the cluster
// replicates, is commanded by `replctl --tls-dir`, serves its volume over
// nbds:// (nbdinfo, and qemu-io with tls-creds, write and read), and fails
// over after a kill -9 of the primary. On the way:
//   - replctl without certificates is refused, and so is a second CA's
//     operator certificate;
//   - a plaintext NBD client is refused with an error that says TLS is
//     required;
//   - /debug/pprof/ without the operator's certificate is refused;
//   - a replnode started as beta with a second CA's files cannot connect,
//     replicate or vote: alpha serves on, beta stays out of date and out of
//     the majority, and once beta returns with its own files it catches up.
func TestE2EACertifiedClusterAdmitsOnlyItsOwn(t *testing.T) {
	e2eBeside(t)
	nbdinfo := RequireTool(t, "nbdinfo", "libnbd-bin")
	RequireTool(t, "qemu-io", "qemu-utils")
	c := newProcClusterN(t, clusterOpts{Raft: true, Witness: true, TLS: true, NBDTLS: "required", Size: 64 << 20})
	c.startAll()
	c.waitFor("alpha", "in sync, and raft knows both replicas UpToDate", syncTimeout, raftInSync)
	certs := filepath.Join(c.tlsDir, "nbd-client")
	nbds := func(node string) string {
		return "nbds://" + c.nodes[node].NBD + "/" + volName + "?tls-certificates=" + certs
	}

	// The volume over NBD: TLS with the cluster's client certificate, or
	// nothing.
	if out := mustRun(t, 30*time.Second, nbdinfo, nbds("alpha")); !strings.Contains(out, "with TLS") {
		t.Fatalf("nbdinfo %s:\n%s", nbds("alpha"), out)
	}
	qemuIOTLS(t, c, "alpha", "write -P 0xa1 0 1M", "read -P 0xa1 0 1M", "flush")
	r := runCmd(30*time.Second, nil, nbdinfo, "nbd://"+c.nodes["alpha"].NBD+"/"+volName)
	if r.ok() || !strings.Contains(r.out, "without TLS") {
		t.Fatalf("a plaintext nbdinfo was not refused: %s", r)
	}
	r = runCmd(30*time.Second, nil, "qemu-io", "-f", "raw", "nbd://"+c.nodes["alpha"].NBD+"/"+volName, "-c", "read 0 4k")
	if r.ok() || !strings.Contains(r.out, "TLS is required") {
		t.Fatalf("a plaintext qemu-io was not refused, or not told TLS is required: %s", r)
	}

	// Operators: only with the cluster's operator certificate.
	alpha := c.nodes["alpha"].Control
	r = runCmd(30*time.Second, []string{"REPLCTL_TLS_DIR="}, replctlBin, "status", "--addr", alpha)
	if r.ok() || !strings.Contains(r.out, "--tls-dir") {
		t.Fatalf("replctl without certificates: %s", r)
	}
	other := c.otherCA()
	r = runCmd(30*time.Second, nil, replctlBin, "primary", volName, "--node", "beta", "--addr", alpha, "--tls-dir", other)
	if r.ok() || !strings.Contains(r.out, "not signed by the CA") {
		t.Fatalf("replctl with a second CA's operator certificate: %s", r)
	}
	if v := c.mustStatusVia("alpha"); v.Primary != "alpha" {
		t.Fatalf("the refused switchover moved the primary to %s", v.Primary)
	}

	// Profiles: the operator's certificate, or nothing.
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(filepath.Join(c.tlsDir, "ca.crt"))
	if err != nil || !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("read the CA: %v", err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}}}
	resp, err := hc.Get("https://" + alpha + "/debug/pprof/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("/debug/pprof/ without a certificate: %s %s", resp.Status, body)
	}

	// A beta of another CA: it cannot connect, replicate or vote.
	c.stop("beta")
	c.start("beta", "--config", c.configUsingTLSDir(other))
	c.waitListening("beta", 30*time.Second)
	qemuIOTLS(t, c, "alpha", "write -P 0xa2 1M 1M", "flush")
	c.waitFor("alpha", "alpha serves on, beta refused and behind", syncTimeout, func(v *volumeStatus) bool {
		b := v.replica("beta")
		return v.Primary == "alpha" && v.NBDURI != "" && b != nil && b.Replication != "Connected" && b.Raft == "Outdated"
	})
	// beta is in no majority: without alpha and the witness it has no
	// leader, and through its own socket it says so.
	r = runCmd(30*time.Second, []string{"REPLCTL_TLS_DIR="}, replctlBin, "status", "--json", "--addr", c.socket("beta"))
	if !r.ok() {
		t.Fatalf("status through beta's socket: %s", r)
	}
	if sd, err := parseStatus(r.out); err != nil || sd.Cluster.Quorum || sd.Cluster.Leader != "" {
		t.Fatalf("beta of another CA: leader %q, quorum %v (%v); want none", sd.Cluster.Leader, sd.Cluster.Quorum, err)
	}
	if v := c.mustStatusVia("alpha"); v.Epoch == 0 || v.Primary != "alpha" {
		t.Fatalf("the stranger changed the primary: %+v", v)
	}

	// beta with its own files again: it catches up.
	c.stop("beta")
	c.start("beta")
	c.waitFor("alpha", "beta back, in sync, UpToDate in raft", syncTimeout, raftInSync)

	// kill -9 of the primary: beta takes over and serves nbds://.
	killed := time.Now()
	c.kill("alpha")
	c.waitFor("beta", "beta promoted after the kill -9 of alpha", 30*time.Second, func(v *volumeStatus) bool {
		return v.Primary == "beta" && v.NBDURI != ""
	})
	qemuIOTLS(t, c, "beta", "read -P 0xa1 0 1M", "read -P 0xa2 1M 1M", "write -P 0xb1 2M 1M", "read -P 0xb1 2M 1M", "flush")
	t.Logf("kill -9 of alpha to a TLS write acknowledged by beta: %s", time.Since(killed).Round(time.Millisecond))
	if r := c.ctlFrom("beta", "beta", "status"); !r.ok() || !strings.Contains(r.out, "beta") {
		t.Fatalf("replctl --tls-dir status from beta: %s", r)
	}
}

// qemuIOTLS runs qemu-io against node's export over TLS with the
// cluster's NBD client certificate, failing the test unless every command
// succeeds.
func qemuIOTLS(t *testing.T, c *procCluster, node string, cmds ...string) string {
	t.Helper()
	qio := RequireTool(t, "qemu-io", "qemu-utils")
	host, port, ok := strings.Cut(c.nodes[node].NBD, ":")
	if !ok {
		t.Fatalf("nbd address %q", c.nodes[node].NBD)
	}
	args := []string{"--object", "tls-creds-x509,id=tls0,dir=" + filepath.Join(c.tlsDir, "nbd-client") + ",endpoint=client",
		"--image-opts", "driver=nbd,server.type=inet,server.host=" + host + ",server.port=" + port + ",export=" + url.PathEscape(volName) + ",tls-creds=tls0"}
	for _, cmd := range cmds {
		args = append(args, "-c", cmd)
	}
	r := runCmd(2*time.Minute, nil, qio, args...)
	low := strings.ToLower(r.out)
	if !r.ok() || strings.Contains(low, "fail") || strings.Contains(low, "error") {
		t.Fatalf("qemu-io over TLS on %s %q: %s", node, cmds, r)
	}
	return r.out
}

// mustStatusVia is vol0's status as node reports it.
func (c *procCluster) mustStatusVia(node string) *volumeStatus {
	c.t.Helper()
	_, v, err := c.status(node)
	if err != nil {
		c.t.Fatal(err)
	}
	return v
}

// TestE2EDemoWithTLSOnItsLinksOnly: replctl demo --tls --nbd-tls off (what
// replbench's replvol-tls-links measures) serves a plain nbd:// export
// that reads back what it wrote, while the control API still demands the
// operator's certificate and the replica is in sync over mutual TLS.
func TestE2EDemoWithTLSOnItsLinksOnly(t *testing.T) {
	e2eBeside(t)
	d := startDemo(t, "--tls", "--nbd-tls", "off")
	if !strings.HasPrefix(d.uri, "nbd://") {
		t.Fatalf("demo --nbd-tls off exports %s, want a plain nbd:// URI", d.uri)
	}
	qemuIO(t, d.uri, "write -P 0x5a 0 1M", "flush")
	if out := qemuIO(t, d.uri, "read -P 0x5a 0 1M"); !strings.Contains(out, "read 1048576/1048576") {
		t.Fatalf("qemu-io read back over plain NBD: %s", out)
	}
	// Without the operator's certificate the control API refuses.
	if r := runCmd(30*time.Second, nil, replctlBin, "--addr", d.nodes["alpha"].Control, "--timeout", "5s", "status"); r.ok() {
		t.Fatalf("replctl status without a certificate against a TLS control API: %s; want it refused", r)
	}
	d.tlsDir = filepath.Join(d.dir, "tls")
	d.waitInSync("alpha")
	if !bytes.Equal(readDisk(t, d.disk("alpha"), 1<<20), readDisk(t, d.disk("beta"), 1<<20)) {
		t.Fatal("the replicas' first MiB differ after the write over TLS replication")
	}
}

// readDisk is the first n bytes of a backing file.
func readDisk(t *testing.T, path string, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := io.ReadFull(f, b); err != nil {
		t.Fatal(err)
	}
	return b
}
