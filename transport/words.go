package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/replvol/replvol/internal/lockorder"
)

// Errors in words. gRPC reports a failed call as text ("rpc error: code =
// Unavailable desc = connection error: desc = \"transport: Error while
// dialing: dial tcp ...: connect: connection refused\""); what reaches an
// operator (replctl, status, events, logs) is a sentence instead, built
// from values: the status code, the call's own deadline, and what this
// package's dialer saw of the connection (the dial error, whether the
// node ever answered). The node's own messages (a refusal, a precondition)
// are words already and stay as they are.

// Why a node could not be reached: fixed words for tools (a node's
// error_code in status), set on a *StreamError as Reach.
const (
	// ReachRefused: nothing listens at the address; the process is not
	// running.
	ReachRefused = "refused"
	// ReachNoAnswer: the node accepts connections but answers nothing in
	// time: it is hung, paused (SIGSTOP) or overloaded.
	ReachNoAnswer = "no-answer"
	// ReachNoConnection: no TCP connection at all: the host is down or
	// unknown, no route, or a firewall drops the packets.
	ReachNoConnection = "no-connection"
	// ReachTLS: the node answered but the TLS between the two failed:
	// one side has a tls: section and the other not, a certificate is of
	// another cluster's CA, or names another node or host.
	ReachTLS = "tls"
)

// StreamError is a failed replication stream or control call, in words:
// what logs, events and status show instead of gRPC's "rpc error: code =
// ... desc = ...". It wraps the gRPC error (status.Code gives its code)
// and, when the node could not be connected to, the dial error
// (errors.Is(err, syscall.ECONNREFUSED) holds).
type StreamError struct {
	words string
	// Reach says why the node could not be reached (ReachRefused,
	// ReachNoAnswer, ReachNoConnection); "" when it was reached.
	Reach string
	// addr and why: the address and the reason of a Reach failure.
	addr, why string
	err       error
	dial      error
}

func (e *StreamError) Error() string { return e.words }

func (e *StreamError) Unwrap() []error {
	if e.dial != nil {
		return []error{e.err, e.dial}
	}
	return []error{e.err}
}

// Named returns e with the node's name in its words ("cannot reach beta at
// 127.0.0.1:7803: connection refused"), for an error that says why a node
// could not be reached; e itself otherwise.
func (e *StreamError) Named(node string) *StreamError {
	if e.Reach == "" || node == "" {
		return e
	}
	named := *e
	named.words = fmt.Sprintf("cannot reach %s at %s: %s", node, e.addr, e.why)
	if e.Reach == ReachTLS {
		named.words = fmt.Sprintf("no TLS with %s at %s: %s", node, e.addr, e.why)
	}
	return &named
}

// streamError puts a gRPC status error of a replication stream into
// words; io.EOF (the peer ended the stream cleanly) and errors that are
// not gRPC's stay as they are.
func streamError(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	var words string
	switch desc := st.Message(); st.Code() {
	case codes.Unknown:
		words = "the peer ended the stream: " + desc
	case codes.Unavailable:
		words = "connection lost: " + desc
	case codes.Canceled:
		words = "stream closed here"
	case codes.DeadlineExceeded:
		words = "timed out: " + desc
	case codes.ResourceExhausted:
		words = "frame too large for the peer: " + desc
	default:
		words = fmt.Sprintf("stream failed (%s): %s", st.Code(), desc)
	}
	return &StreamError{words: words, err: err}
}

// unreachable is the error of a call or stream whose node d could not
// connect to, or nil when d saw nothing of the kind.
func (d *dialer) unreachable(err error) *StreamError {
	code, why, dialErr := d.reach()
	if code == "" {
		return nil
	}
	words := fmt.Sprintf("cannot reach %s: %s", d.addr, why)
	if code == ReachTLS {
		words = fmt.Sprintf("no TLS with %s: %s", d.addr, why)
	}
	return &StreamError{words: words, Reach: code, addr: d.addr, why: why, err: err, dial: dialErr}
}

// callError puts a failed control call into words: a call that could not
// reach its node says why, one its own deadline cut off says how long it
// waited for an answer; anything else (the node's own refusals, in words
// already) stays as it is. waited is how long the call ran; ranOut: its
// deadline came.
func (d *dialer) callError(err error, waited time.Duration, ranOut bool) error {
	var se *StreamError
	if err == nil || errors.As(err, &se) {
		return err
	}
	switch status.Code(err) {
	case codes.Unavailable:
		if se := d.unreachable(err); se != nil {
			return se
		}
	case codes.DeadlineExceeded:
		if !ranOut {
			return err // the node's own words
		}
		if se := d.unreachable(err); se != nil {
			return se
		}
		why := fmt.Sprintf("no answer within %s: is replnode hung, paused or overloaded?", waited.Round(100*time.Millisecond))
		return &StreamError{words: fmt.Sprintf("%s did not answer: %s", d.addr, why), Reach: ReachNoAnswer, addr: d.addr, why: why, err: err}
	}
	return err
}

// dialer connects to one node and remembers what it saw: gRPC keeps only
// the text of a failed dial, so a failed call is put in words from these
// values instead.
type dialer struct {
	addr string
	// watch wraps each connection to learn whether the node ever answered
	// on it (not for the replication stream: gRPC tunes a *net.TCPConn it
	// can see, and the stream's reads are hot).
	watch bool

	// tls: the client speaks TLS (handshakeCreds report to it).
	tls bool

	mu      lockorder.Mutex
	dialing int   // TCP connects in progress
	err     error // the last connect's error; nil once one succeeded
	conn    *answerConn
	// handshakeErr is the last TLS handshake's error; nil once one
	// succeeded.
	handshakeErr error
}

func newDialer(addr string, watch bool) *dialer { return &dialer{addr: addr, watch: watch} }

func (d *dialer) dial(ctx context.Context, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.dialing++
	d.mu.Unlock()
	var conn net.Conn
	var err error
	if path, ok := UnixPath(addr); ok {
		conn, err = DialUnix(ctx, path)
	} else {
		var nd net.Dialer
		conn, err = nd.DialContext(ctx, "tcp", addr)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dialing--
	d.err = err
	if err != nil {
		return nil, err
	}
	if !d.watch {
		return conn, nil
	}
	d.conn = &answerConn{Conn: conn, plain: !d.tls}
	return d.conn, nil
}

// handshook notes how a TLS handshake of the client ended.
func (d *dialer) handshook(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.handshakeErr = err
}

// handshakeCreds are TLS credentials that tell the dialer how each
// handshake ended: gRPC keeps only its text.
type handshakeCreds struct {
	credentials.TransportCredentials
	d      *dialer
	failed func(error)
}

func (c *handshakeCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if ctx.Err() == nil {
		c.d.handshook(err)
		if err != nil && c.failed != nil {
			c.failed(err)
		}
	}
	return conn, info, err
}

func (c *handshakeCreds) Clone() credentials.TransportCredentials {
	return &handshakeCreds{TransportCredentials: c.TransportCredentials.Clone(), d: c.d, failed: c.failed}
}

// reach says why the node cannot be reached, from what the dials saw: a
// connect that failed, one that is still waiting, or a connection on
// which the node never sent a byte; "" when none of these.
func (d *dialer) reach() (code, why string, dialErr error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.err != nil:
		code = ReachNoConnection
		if errors.Is(d.err, syscall.ECONNREFUSED) {
			code = ReachRefused
		}
		return code, DialWords(d.err), d.err
	case d.handshakeErr != nil:
		return ReachTLS, TLSWords(d.handshakeErr), d.handshakeErr
	case d.conn != nil && d.conn.spokeTLS.Load():
		return ReachTLS, "it requires TLS (its cluster file has a tls: section) and this client has no certificate", nil
	case d.dialing > 0:
		return ReachNoConnection, "no answer to a TCP connection: a firewall, or the host is down", nil
	case d.conn != nil && !d.conn.answered.Load():
		return ReachNoAnswer, "it accepts connections but answers nothing: is replnode hung or paused?", nil
	}
	return "", "", nil
}

// answerConn notes whether the other side ever sent a byte and, on a
// plaintext connection, whether its first byte began a TLS record: a node
// that requires TLS answers a plaintext client with a TLS alert.
type answerConn struct {
	net.Conn
	plain    bool
	answered atomic.Bool
	spokeTLS atomic.Bool
}

// TLS record types a TLS server may send first: an alert, a handshake.
const (
	tlsRecordAlert     = 0x15
	tlsRecordHandshake = 0x16
)

func (c *answerConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.answered.Load() {
		if c.plain && (p[0] == tlsRecordAlert || p[0] == tlsRecordHandshake) {
			c.spokeTLS.Store(true)
		}
		c.answered.Store(true)
	}
	return n, err
}

// TLSWords says why a client's TLS handshake with a node failed, from the
// error's value.
func TLSWords(err error) string {
	var notTLS tls.RecordHeaderError
	var host x509.HostnameError
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &notTLS):
		return "it does not speak TLS: its cluster file has no tls: section (give every node the same one)"
	case errors.As(err, &host):
		names := append([]string(nil), host.Certificate.DNSNames...)
		for _, ip := range host.Certificate.IPAddresses {
			names = append(names, ip.String())
		}
		return fmt.Sprintf("its certificate is not for host %q (it names %s): dial it by an address its certificate names, or make its certificate name this one (replctl certs init --host)", host.Host, strings.Join(names, ", "))
	case errors.As(err, &unknown):
		return "its certificate was not signed by the CA this client trusts: it belongs to another cluster, or the CA file does"
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return "its certificate has expired (or is not valid yet: check the clocks): run replctl certs init again"
	}
	return "the TLS handshake failed: " + err.Error()
}

// DialWords says why a TCP connection failed, from the error's value.
func DialWords(err error) string {
	var dnsErr *net.DNSError
	var netErr net.Error
	var addrErr *net.AddrError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused: nothing listens on that port"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to that host"
	case errors.As(err, &dnsErr):
		return fmt.Sprintf("host %q not found", dnsErr.Name)
	case errors.As(err, &addrErr):
		return fmt.Sprintf("%q is not HOST:PORT (%s)", addrErr.Addr, addrErr.Err)
	case errors.As(err, &netErr) && netErr.Timeout():
		return "no answer to a TCP connection in time: a firewall, or the host is down"
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Err != nil {
		var sysErr *os.SyscallError
		if errors.As(opErr.Err, &sysErr) {
			return sysErr.Err.Error()
		}
		return opErr.Err.Error()
	}
	return err.Error()
}
