package nbd

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"time"
)

// NBD over TLS (proto.md, "TLS support"). NBD_OPT_STARTTLS is acknowledged in plaintext; the
// TLS handshake then runs on the same TCP connection, under the negotiation's deadline, and
// negotiation goes on inside TLS. Nothing an option did before carries over (no option keeps
// state), and bytes the client sent after STARTTLS but before the acknowledgement close the
// connection: they must not be read as if they came through TLS.

// tlsRecordSize is the most plaintext one TLS record carries: replies are gathered into records
// of up to this size.
const tlsRecordSize = 16 << 10

// closeNotifyTimeout bounds the close_notify alert a TLS connection sends as it ends.
const closeNotifyTimeout = time.Second

// startTLSOption answers NBD_OPT_STARTTLS and, once it is acknowledged, runs the TLS handshake.
// It returns false if the connection must close.
func (c *serverConn) startTLSOption(data []byte, clientFlags uint32) bool {
	var replyType uint32
	var message string
	switch {
	case c.srv.tlsConfig == nil:
		replyType, message = repErrUnsup, "this server has no TLS: connect without it (nbd://)"
	case c.srv.tlsPolicy == TLSOff:
		replyType, message = repErrPolicy, "TLS is off on this server: connect without it (nbd://)"
	case c.tls != nil:
		replyType, message = repErrInvalid, "TLS is on already: NBD_OPT_STARTTLS may be sent once"
	case len(data) != 0:
		replyType, message = repErrInvalid, "NBD_OPT_STARTTLS carries no data"
	case clientFlags&clientFixedNewstyle == 0:
		replyType, message = repErrPolicy, "TLS needs the fixed newstyle negotiation, which this client did not ask for"
	}
	if replyType != 0 {
		if err := c.sendOptionReply(optStartTLS, replyType, []byte(message)); err != nil {
			c.logReadError("handshake", err)
			return false
		}
		return true
	}
	if c.r.Buffered() > 0 {
		c.srv.stats.tlsFailed.Add(1)
		c.logTLSFailure(errors.New("the client sent data after NBD_OPT_STARTTLS before the server acknowledged it"))
		return false
	}
	if err := c.sendOptionReply(optStartTLS, repAck, nil); err != nil {
		c.logReadError("handshake", err)
		return false
	}
	c.progress = &progressConn{Conn: c.conn}
	t := tls.Server(c.progress, c.srv.tlsConfig)
	// No context: the connection's deadlines bound the handshake, and Shutdown interrupts it
	// as it interrupts any read of a negotiating connection.
	if err := t.Handshake(); err != nil {
		c.srv.stats.tlsFailed.Add(1)
		c.logTLSFailure(err)
		return false
	}
	c.tls, c.stream = t, t
	c.r.Reset(t)
	c.srv.stats.tlsDone.Add(1)
	state := t.ConnectionState()
	if len(state.PeerCertificates) > 0 {
		leaf := state.PeerCertificates[0]
		c.log = c.log.With("client_certificate", leaf.Subject.CommonName)
		c.log.Debug("nbd: TLS on", "uris", fmt.Sprint(leaf.URIs))
	}
	return true
}

func (c *serverConn) logTLSFailure(err error) {
	if ok, suppressed := c.srv.tlsFailedLog.allow(time.Now()); ok {
		c.log.Warn("nbd: TLS refused; connection closed", "err", err,
			"want", "a client certificate the server accepts, as in tls-certificates="+c.srv.tlsHint, "failed_since_last_line", suppressed+1)
	}
}

// tlsRequiredRefusal counts and logs an option refused because TLS is required, and returns the
// message for the client: what to do.
func (c *serverConn) tlsRequiredRefusal(option uint32, data []byte) string {
	c.srv.stats.tlsRequired.Add(1)
	if ok, suppressed := c.srv.tlsRequiredLog.allow(time.Now()); ok {
		c.log.Info("nbd: a client without TLS was refused: TLS is required", "option", option,
			"refused_since_last_line", suppressed+1)
	}
	export := "EXPORT"
	switch option {
	case optExportName:
		export = string(data)
	case optGo, optInfo:
		if req, err := parseInfoRequest(data); err == nil {
			export = req.name
		}
	}
	return truncateString(fmt.Sprintf("TLS is required: this server serves NBD only over TLS, to clients with a certificate of its CA; "+
		"connect with TLS, e.g. nbds://%s/%s?tls-certificates=%s", c.conn.LocalAddr(), url.PathEscape(export), c.srv.tlsHint))
}

// growReadBuffer gives the connection its transmission read buffer, keeping what the small
// negotiation buffer holds already (requests a client pipelined after NBD_OPT_GO).
func (c *serverConn) growReadBuffer() {
	var src io.Reader = c.stream
	if n := c.r.Buffered(); n > 0 {
		pending, _ := c.r.Peek(n)
		src = io.MultiReader(bytes.NewReader(bytes.Clone(pending)), c.stream)
	}
	c.r = bufio.NewReaderSize(src, transmissionReadBuffer)
}

// closeConn closes the connection as serve ends. A TLS connection not broken before says
// close_notify first (proto.md: after NBD_CMD_DISC the server closes the TLS session, then
// TCP), for at most closeNotifyTimeout, so a client that reads nothing holds nobody. A drained
// connection ends in order (closeInOrder).
func (c *serverConn) closeConn() {
	if c.drained && !c.broken() {
		c.closeInOrder()
		return
	}
	if c.tls != nil && !c.broken() {
		c.progress.watch(0)
		timer := time.AfterFunc(closeNotifyTimeout, func() { _ = c.conn.Close() })
		_ = c.tls.Close()
		timer.Stop()
	}
	_ = c.conn.Close()
}

// broken reports whether the connection was broken (breakConn) or cut while negotiating.
func (c *serverConn) broken() bool {
	select {
	case <-c.stopReading:
		return true
	default:
		return false
	}
}

// writeRepliesTLS is writeReplies over TLS: the round's pieces are gathered into records of up
// to tlsRecordSize (a reply header alone would otherwise be a record and a syscall of its own);
// READ data beyond a record goes to the TLS connection as it is. StallTimeout applies in
// progressConn, under TLS, where a write can go on after a deadline.
func (c *serverConn) writeRepliesTLS(w net.Buffers) error {
	if c.tlsOut == nil {
		c.tlsOut = bufio.NewWriterSize(c.tls, tlsRecordSize)
	}
	for _, b := range w {
		if _, err := c.tlsOut.Write(b); err != nil {
			return err
		}
	}
	return c.tlsOut.Flush()
}

// progressConn is the TCP connection under TLS. Once watching (transmission), a write that
// takes no byte for the stall time returns errStalled, and one that makes progress goes on, as
// writeReplies does for plaintext: a TLS connection whose write hit a deadline cannot be
// written again, so the deadline must never end a write that is making progress. Before that,
// writes are the connection's own, under the negotiation's deadline. Writes come from the TLS
// connection, one at a time.
type progressConn struct {
	net.Conn
	stall    time.Duration // 0: not watching
	deadline time.Time     // the write deadline set last while watching
}

// watch starts (stall > 0) or stops applying stall to writes. It must not run during a write.
func (p *progressConn) watch(stall time.Duration) {
	p.stall, p.deadline = stall, time.Time{}
}

func (p *progressConn) Write(b []byte) (int, error) {
	if p.stall == 0 {
		return p.Conn.Write(b)
	}
	written := 0
	for {
		// Renewing costs a timer update: do it only when less than the stall time is left.
		if now := time.Now(); p.deadline.Sub(now) < p.stall {
			p.deadline = now.Add(p.stall + p.stall/8)
			_ = p.Conn.SetWriteDeadline(p.deadline)
		}
		n, err := p.Conn.Write(b[written:])
		written += n
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return written, err
		}
		if n == 0 {
			return written, errStalled
		}
		p.deadline = time.Time{}
	}
}
