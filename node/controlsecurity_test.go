package node

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replvol/replvol/config"
	"github.com/replvol/replvol/internal/pki"
	"github.com/replvol/replvol/node/cluster"
	"github.com/replvol/replvol/transport"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// logBuffer collects a node's log for a test to read.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// count is how many lines of the log hold every one of words.
func (b *logBuffer) count(words ...string) int {
	n := 0
	for _, l := range strings.Split(b.String(), "\n") {
		all := true
		for _, w := range words {
			all = all && strings.Contains(l, w)
		}
		if all {
			n++
		}
	}
	return n
}

// logTo sends node name's log to a new buffer, and its INFO and above
// to the tail a failed test shows (logNodes) as well.
func (c *testCluster) logTo(name string) *logBuffer {
	b := &logBuffer{}
	o := c.opts[name]
	h := []slog.Handler{slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})}
	if c.logs != nil {
		if c.logs[name] == nil {
			c.logs[name] = &logTail{}
		}
		h = append(h, slog.NewTextHandler(c.logs[name], nil))
	}
	o.Logger = slog.New(slog.NewMultiHandler(h...))
	c.opts[name] = o
	return b
}

// loadBundle reads holder's certificate of a replctl certs init directory.
func loadBundle(t *testing.T, dir, holder string) *pki.Bundle {
	t.Helper()
	b, err := pki.Load(filepath.Join(dir, pki.CAFile), filepath.Join(dir, pki.CertFile(holder)), filepath.Join(dir, pki.KeyFile(holder)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// dialAs is a control client to addr with b's certificate that expects a
// node of b's CA there, as replctl --tls-dir dials.
func dialAs(t *testing.T, b *pki.Bundle, addr string, opts ...transport.DialOption) *transport.ControlClient {
	t.Helper()
	cl, err := transport.DialControl(addr, append(opts, transport.WithTLS(b.ClientConfig(addr, pki.Roles(pki.RoleNode))))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// dialWith is a control client to addr speaking TLS with cfg.
func dialWith(t *testing.T, addr string, cfg *tls.Config) *transport.ControlClient {
	t.Helper()
	cl, err := transport.DialControl(addr, transport.WithTLS(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

func requireCode(t *testing.T, err error, want codes.Code, words string) {
	t.Helper()
	if status.Code(err) != want || !strings.Contains(status.Convert(err).Message(), words) {
		t.Fatalf("got %v (%s); want %s saying %q", err, status.Code(err), want, words)
	}
}

// TestATLSClusterIsCommandedOnlyWithTheOperatorsCertificate: alpha and
// beta with a tls: section from replctl certs init. The operator's
// certificate reads the status of both (alpha asks beta over TLS with its
// node certificate), disconnects and connects beta through alpha (a
// forwarded command), and switches the primary over and back (alpha
// forwards beta's promotion, then its demotion). No certificate is refused
// as unauthenticated, saying to pass --tls-dir; a second CA's operator
// certificate is refused; a node's certificate reads but may not command,
// nor claim another node forwarded its call; a plaintext client is told
// the node requires TLS; each refusal is logged once per peer and cause.
func TestATLSClusterIsCommandedOnlyWithTheOperatorsCertificate(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 4<<20)
	dir := withTLS(t, c)
	alphaLog := c.logTo("alpha")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	alphaAddr := c.nodes["alpha"].ControlAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	op := dialAs(t, loadBundle(t, dir, "operator"), alphaAddr)
	st, err := op.ClusterStatus(ctx, &transport.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if !n.Alive {
			t.Fatalf("node %s is not reached over TLS: %s", n.Name, n.Error)
		}
	}
	if _, err := op.Disconnect(ctx, &transport.ConnectRequest{Volume: "vol0", Node: "beta"}); err != nil {
		t.Fatalf("disconnect --node beta through alpha: %v", err)
	}
	eventually(t, func() bool { return c.vol("beta").isAdminDown() }, "beta disconnected by the forwarded command")
	if _, err := op.Connect(ctx, &transport.ConnectRequest{Volume: "vol0", Node: "beta"}); err != nil {
		t.Fatalf("connect --node beta through alpha: %v", err)
	}
	c.waitInSync()
	if n := alphaLog.count("msg=\"refused "); n != 0 {
		t.Fatalf("alpha refused something of the operator's or beta's:\n%s", alphaLog)
	}
	if r, err := op.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta"}); err != nil || r.Primary != "beta" {
		t.Fatalf("switchover to beta through alpha: %+v %v", r, err)
	}
	c.waitInSync()
	if r, err := op.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "alpha"}); err != nil || r.Primary != "alpha" {
		t.Fatalf("switchover back to alpha through alpha: %+v %v", r, err)
	}
	if alphaLog.count("forwarded command", "Demote", "forwarded_by=alpha") != 0 {
		t.Fatal("alpha logged its own in-process call as forwarded")
	}

	ca := loadBundle(t, dir, "operator").CA
	noCert := dialWith(t, alphaAddr, &tls.Config{RootCAs: ca, MinVersion: tls.VersionTLS13})
	_, err = noCert.ClusterStatus(ctx, &transport.StatusRequest{})
	requireCode(t, err, codes.Unauthenticated, "pass --tls-dir")
	_, err = noCert.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta"})
	requireCode(t, err, codes.Unauthenticated, "unix socket")

	other := t.TempDir()
	if _, err := pki.Init(other, []pki.Holder{{Identity: pki.Identity{Role: pki.RoleNode, Name: "alpha"}, Hosts: []string{"127.0.0.1"}}}, false); err != nil {
		t.Fatal(err)
	}
	stranger := loadBundle(t, other, "operator")
	// The stranger trusts this cluster's CA: the node refuses its
	// certificate, in words.
	strangerCl := dialWith(t, alphaAddr, &tls.Config{RootCAs: ca, Certificates: []tls.Certificate{stranger.Cert}, MinVersion: tls.VersionTLS13})
	_, err = strangerCl.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta"})
	requireCode(t, err, codes.Unauthenticated, "not one of this cluster's")
	// With its own CA too, the stranger refuses the node.
	_, err = dialAs(t, stranger, alphaAddr).ClusterStatus(ctx, &transport.StatusRequest{})
	var se *transport.StreamError
	if !errors.As(err, &se) || se.Reach != transport.ReachTLS || !strings.Contains(err.Error(), "not signed by the CA this client trusts") {
		t.Fatalf("a client of another CA: %v", err)
	}

	beta := loadBundle(t, dir, "beta")
	asBeta := dialAs(t, beta, alphaAddr)
	if _, err := asBeta.NodeStatus(ctx, &transport.StatusRequest{}); err != nil {
		t.Fatalf("beta's certificate reads alpha's status: %v", err)
	}
	for i := 0; i < 3; i++ {
		_, err = asBeta.Disconnect(ctx, &transport.ConnectRequest{Volume: "vol0", Node: "alpha"})
		requireCode(t, err, codes.PermissionDenied, "the certificate of node beta may not run Disconnect")
	}
	if n := alphaLog.count("refused a control call", "method=Disconnect", "node beta"); n != 1 {
		t.Fatalf("alpha logged beta's three refused disconnects %d times, want once:\n%s", n, alphaLog)
	}
	forged := metadata.AppendToOutgoingContext(ctx, "replvol-forwarded-by", "alpha", "replvol-on-behalf-of", "operator operator")
	_, err = asBeta.Disconnect(forged, &transport.ConnectRequest{Volume: "vol0", Node: "alpha"})
	requireCode(t, err, codes.PermissionDenied, "says node alpha forwarded it, but it came with the certificate of node beta")
	if c.vol("alpha").isAdminDown() {
		t.Fatal("a refused call disconnected alpha")
	}

	plain, err := transport.DialControl(alphaAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	_, err = plain.ClusterStatus(ctx, &transport.StatusRequest{})
	if !errors.As(err, &se) || se.Reach != transport.ReachTLS || !strings.Contains(err.Error(), "requires TLS") {
		t.Fatalf("a plaintext client: %v", err)
	}
	eventually(t, func() bool { return alphaLog.count("refused a control connection", "spoke plaintext") == 1 }, "alpha logs the plaintext client")
}

// isAdminDown says whether the volume was disconnected on purpose.
func (v *Volume) isAdminDown() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.st.AdminDown
}

// TestTheUnixSocketNeedsNoCertificate: every node listens on
// STATE_DIR/control.sock, mode 0600, replacing a stale socket at start;
// a client there commands the TLS cluster without any certificate (a
// disconnect, forwarded to beta under alpha's node certificate), and the
// socket is gone after a clean stop.
func TestTheUnixSocketNeedsNoCertificate(t *testing.T) {
	beside(t)
	c := newTestCluster(t, 4<<20)
	withTLS(t, c)
	sock := filepath.Join(c.cfg.Nodes[0].StateDir, "control.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		t.Fatal(err)
	}
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	if got := c.nodes["alpha"].ControlSocket(); got != "unix://"+sock {
		t.Fatalf("ControlSocket() = %q, want unix://%s", got, sock)
	}
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: mode %v, want a socket of mode 0600", sock, fi.Mode())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	local, err := transport.DialControl("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	st, err := local.ClusterStatus(ctx, &transport.StatusRequest{})
	if err != nil || len(st.Nodes) != 2 || !st.Nodes[1].Alive {
		t.Fatalf("status through the unix socket: %+v %v", st, err)
	}
	if _, err := local.Disconnect(ctx, &transport.ConnectRequest{Volume: "vol0", Node: "beta"}); err != nil {
		t.Fatalf("disconnect --node beta through alpha's unix socket: %v", err)
	}
	eventually(t, func() bool { return c.vol("beta").isAdminDown() }, "beta disconnected")
	if _, err := local.Connect(ctx, &transport.ConnectRequest{Volume: "vol0", Node: "beta"}); err != nil {
		t.Fatal(err)
	}
	c.waitInSync()
	c.stop("alpha")
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("the socket is still there after a clean stop: %v", err)
	}
}

// TestThePagesAreReadableAndProfilesNeedTheOperator: over HTTPS on the
// control port, the page, /api/status and /metrics answer a browser
// without a certificate, over HTTP/1.1 and HTTP/2; /debug/pprof/ answers
// 403 in words without a certificate and with a node's, and 200 with the
// operator's or through the unix socket.
func TestThePagesAreReadableAndProfilesNeedTheOperator(t *testing.T) {
	c := newTestCluster(t, 4<<20)
	dir := withTLS(t, c)
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	addr := c.nodes["alpha"].ControlAddr()
	op := loadBundle(t, dir, "operator")
	client := func(cert *tls.Certificate, h2 bool) *http.Client {
		cfg := &tls.Config{RootCAs: op.CA, MinVersion: tls.VersionTLS13}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: h2}
		if !h2 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 20 * time.Second}
	}
	get := func(hc *http.Client, url string) (int, string, int) {
		t.Helper()
		resp, err := hc.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		if resp.Header.Get("Content-Type") == "text/event-stream" {
			return resp.StatusCode, "(a stream)", resp.ProtoMajor // a stream never ends
		}
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), resp.ProtoMajor
	}
	for _, h2 := range []bool{false, true} {
		browser := client(nil, h2)
		for _, path := range []string{"/", "/api/status", "/api/events", "/metrics"} {
			if code, body, proto := get(browser, "https://"+addr+path); code != 200 || (h2 && proto != 2) || (!h2 && proto != 1) {
				t.Fatalf("%s without a certificate (HTTP/%d, want h2 %v): %d %s", path, proto, h2, code, body)
			}
		}
		code, body, _ := get(browser, "https://"+addr+"/debug/pprof/")
		if code != http.StatusForbidden || !strings.Contains(body, "needs the operator's certificate") {
			t.Fatalf("/debug/pprof/ without a certificate: %d %s", code, body)
		}
	}
	beta := loadBundle(t, dir, "beta")
	if code, body, _ := get(client(&beta.Cert, true), "https://"+addr+"/debug/pprof/"); code != http.StatusForbidden || !strings.Contains(body, "node beta") {
		t.Fatalf("/debug/pprof/ with beta's certificate: %d %s", code, body)
	}
	if code, body, _ := get(client(&op.Cert, true), "https://"+addr+"/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Fatalf("/debug/pprof/ with the operator's certificate: %d %s", code, body)
	}
	req, _ := http.NewRequest(http.MethodPost, "https://"+addr+"/api/status", nil)
	if resp, err := client(&op.Cert, true).Do(req); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /api/status: %v %v", resp, err)
	}
	sock := filepath.Join(c.cfg.Nodes[0].StateDir, "control.sock")
	local := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return transport.DialUnix(ctx, sock)
	}}, Timeout: 20 * time.Second}
	if code, body, _ := get(local, "http://localhost/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Fatalf("/debug/pprof/ through the unix socket: %d %s", code, body)
	}
}

// TestATLSRaftClusterForwardsOverTLS: alpha, beta and a witness with raft
// and a tls: section. Lease renewals and raft proposals travel between
// the nodes' control ports under their node certificates (a lease is
// renewed only in the name of the node whose certificate sends it), and
// a switchover the operator sends to the witness is forwarded (the
// demotion to alpha, the proposal to the leader) and completes; no node
// refuses anything.
func TestATLSRaftClusterForwardsOverTLS(t *testing.T) {
	c := newRaftCluster(t, 8<<20)
	dir := withTLS(t, c)
	logs := map[string]*logBuffer{}
	for _, n := range []string{"alpha", "beta", "wit"} {
		logs[n] = c.logTo(n)
	}
	c.start("wit")
	c.start("alpha")
	c.start("beta")
	c.waitInSync()
	a := c.vol("alpha")
	eventually(t, func() bool { return a.WriteAt(context.Background(), pattern(1, 64<<10), 0, false) == nil }, "alpha serves under its lease")
	eventually(t, func() bool {
		va, ok := c.nodes["wit"].cl.c.Authority().Volume("vol0")
		return ok && va.IsUpToDate("beta")
	}, "raft knows beta UpToDate")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	op := dialAs(t, loadBundle(t, dir, "operator"), c.nodes["wit"].ControlAddr())
	r, err := op.Primary(ctx, &transport.PrimaryRequest{Volume: "vol0", Node: "beta"})
	if err != nil || r.Primary != "beta" {
		t.Fatalf("switchover to beta through the witness: %+v %v", r, err)
	}
	b := c.vol("beta")
	eventually(t, func() bool { return b.WriteAt(context.Background(), pattern(2, 4096), 0, false) == nil }, "beta serves under its lease")
	for name, log := range logs {
		if n := log.count(`msg="refused `); n != 0 {
			t.Fatalf("%s refused something:\n%s", name, log)
		}
	}
	if logs["alpha"].count("forwarded command", "method=Demote", "forwarded_by=wit", "on_behalf_of=\"operator operator\"") != 1 {
		t.Fatalf("alpha did not log the demotion the witness forwarded for the operator:\n%s", logs["alpha"])
	}

	asBeta := dialAs(t, loadBundle(t, dir, "beta"), c.nodes["wit"].ControlAddr())
	ask := func(from string) error {
		body, err := json.Marshal(cluster.ForwardRequest{Kind: cluster.KindVoters, From: from})
		if err != nil {
			t.Fatal(err)
		}
		_, err = asBeta.ClusterForward(ctx, &transport.ClusterMessage{Body: body})
		return err
	}
	if err := ask("beta"); err != nil {
		t.Fatalf("beta's certificate asks the witness for the voters in its own name: %v", err)
	}
	requireCode(t, ask("alpha"), codes.PermissionDenied, "a cluster message from alpha came with the certificate of node beta")
	_, err = dialAs(t, loadBundle(t, dir, "operator"), c.nodes["wit"].ControlAddr()).ClusterForward(ctx, &transport.ClusterMessage{Body: []byte("{}")})
	requireCode(t, err, codes.PermissionDenied, "between nodes only")
}

// TestTheTLSSectionLoadsFromTheFile: the cluster file's tls: section, as
// replctl certs init prints it, loads (an optional section of the file),
// and a mistake in it is named with its line.
func TestTheTLSSectionLoadsFromTheFile(t *testing.T) {
	base := `nodes:
  - {name: alpha, control: "127.0.0.1:7800", replication: "127.0.0.1:7801", nbd: "127.0.0.1:7802", state_dir: /tmp/a}
  - {name: beta, control: "127.0.0.1:7803", replication: "127.0.0.1:7804", nbd: "127.0.0.1:7805", state_dir: /tmp/b}
volumes:
  - {name: vol0, size: 1GiB, primary: alpha, disks: {alpha: /tmp/a.img, beta: /tmp/b.img}}
`
	cfg, err := config.Parse("cluster.yaml", []byte(base+`tls:
  ca: /etc/replvol/tls/ca.crt
  cert: /etc/replvol/tls/{node}.crt
  key: /etc/replvol/tls/{node}.key
  nbd: optional
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLS == nil || cfg.TLS.CertFor("beta") != "/etc/replvol/tls/beta.crt" || cfg.TLS.KeyFor("alpha") != "/etc/replvol/tls/alpha.key" || cfg.TLS.NBDPolicy() != NBDTLSOptional {
		t.Fatalf("tls: %+v", cfg.TLS)
	}
	if cfg, err := config.Parse("cluster.yaml", []byte(base)); err != nil || cfg.TLS != nil {
		t.Fatalf("a file without tls: %+v %v", cfg, err)
	}
	_, err = config.Parse("cluster.yaml", []byte(base+"tls:\n  ca: /ca.crt\n  cert: /{node}.crt\n  key: /{node}.key\n  certs: /x\n"))
	if err == nil || !strings.Contains(err.Error(), "cluster.yaml:10: tls.certs: unknown key") {
		t.Fatalf("a misspelt key in tls: %v", err)
	}
}
