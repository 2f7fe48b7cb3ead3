package nbdclient

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// ErrProtocol is a server that does not speak the NBD protocol as this client expects.
var ErrProtocol = errors.New("NBD protocol error")

// Negotiate runs the handshake on conn: the fixed newstyle greeting, NBD_OPT_STARTTLS and the
// TLS handshake when tlsConf is not nil, then NBD_OPT_GO for export. It returns the connection
// to use in the transmission phase (the TLS connection when tlsConf was given), with nothing of
// it read ahead, so that it may also be handed to the kernel. ctx bounds the handshake; an
// error reply is an *OptionError. On error conn is left open: the caller closes it.
func Negotiate(ctx context.Context, conn net.Conn, export string, tlsConf *tls.Config) (net.Conn, Export, error) {
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	conn, err := greet(ctx, conn, tlsConf)
	if err != nil {
		return nil, Export{}, err
	}
	ex, err := exportOption(ctx, conn, optGo, export)
	if err != nil {
		return nil, Export{}, err
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, ex, nil
}

// Info runs the handshake on conn as Negotiate does, but asks NBD_OPT_INFO instead of
// NBD_OPT_GO and then ends it (NBD_OPT_ABORT): it tells what the server would give a new
// connection to export now (its size, which grows with an online resize, while a connection
// in the transmission phase keeps the size it was told), and it never enters the transmission
// phase. The caller closes conn.
func Info(ctx context.Context, conn net.Conn, export string, tlsConf *tls.Config) (Export, error) {
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	conn, err := greet(ctx, conn, tlsConf)
	if err != nil {
		return Export{}, err
	}
	ex, err := exportOption(ctx, conn, optInfo, export)
	if err != nil {
		return Export{}, err
	}
	// The abort's ack is a courtesy the protocol lets either side skip.
	if sendOption(conn, optAbort, nil) == nil {
		_, _ = readOptionReply(conn, optAbort)
	}
	return ex, nil
}

// greet runs the greeting, and NBD_OPT_STARTTLS with the TLS handshake when tlsConf is not nil;
// it returns the connection the options go on.
func greet(ctx context.Context, conn net.Conn, tlsConf *tls.Config) (net.Conn, error) {
	var greeting [18]byte
	if _, err := io.ReadFull(conn, greeting[:]); err != nil {
		return nil, fmt.Errorf("read the NBD greeting: %w", ctxErr(ctx, err))
	}
	if binary.BigEndian.Uint64(greeting[0:]) != magicInit || binary.BigEndian.Uint64(greeting[8:]) != magicOption {
		return nil, fmt.Errorf("%w: the server at %s sent no newstyle NBD greeting (%x): is it an NBD server?", ErrProtocol, conn.RemoteAddr(), greeting[:16])
	}
	flags := binary.BigEndian.Uint16(greeting[16:])
	if flags&handshakeFixedNewstyle == 0 {
		return nil, fmt.Errorf("%w: the server does not offer the fixed newstyle handshake", ErrProtocol)
	}
	clientFlags := uint32(handshakeFixedNewstyle)
	if flags&handshakeNoZeroes != 0 {
		clientFlags |= handshakeNoZeroes
	}
	if _, err := conn.Write(binary.BigEndian.AppendUint32(nil, clientFlags)); err != nil {
		return nil, ctxErr(ctx, err)
	}
	if tlsConf == nil {
		return conn, nil
	}
	if err := sendOption(conn, optStartTLS, nil); err != nil {
		return nil, ctxErr(ctx, err)
	}
	rep, err := readOptionReply(conn, optStartTLS)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	if rep.typ != repAck {
		return nil, optionError("NBD_OPT_STARTTLS", rep)
	}
	t := tls.Client(conn, tlsConf)
	if err := t.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("TLS handshake with the NBD server: %w", ctxErr(ctx, err))
	}
	return t, nil
}

// exportOption sends NBD_OPT_GO or NBD_OPT_INFO (option) for export and reads the export's
// information until the server's ack.
func exportOption(ctx context.Context, conn net.Conn, option uint32, export string) (Export, error) {
	name := "NBD_OPT_GO"
	if option == optInfo {
		name = "NBD_OPT_INFO"
	}
	payload := binary.BigEndian.AppendUint32(nil, uint32(len(export)))
	payload = append(payload, export...)
	payload = binary.BigEndian.AppendUint16(payload, 1)
	payload = binary.BigEndian.AppendUint16(payload, infoBlockSize)
	if err := sendOption(conn, option, payload); err != nil {
		return Export{}, ctxErr(ctx, err)
	}
	ex := Export{Name: export}
	haveSize := false
	for {
		rep, err := readOptionReply(conn, option)
		if err != nil {
			return Export{}, ctxErr(ctx, err)
		}
		switch {
		case rep.typ == repAck:
			if !haveSize {
				return Export{}, fmt.Errorf("%w: %s ended without the export's size", ErrProtocol, name)
			}
			return ex, nil
		case rep.typ&(1<<31) != 0:
			return Export{}, optionError(name, rep)
		case rep.typ != repInfo || len(rep.data) < 2:
			// Another reply the client did not ask for: the protocol says to ignore it.
			continue
		}
		d := rep.data
		switch binary.BigEndian.Uint16(d) {
		case infoExport:
			if len(d) != 12 {
				return Export{}, fmt.Errorf("%w: NBD_INFO_EXPORT of %d bytes", ErrProtocol, len(d))
			}
			ex.Size = int64(binary.BigEndian.Uint64(d[2:]))
			ex.Flags = binary.BigEndian.Uint16(d[10:])
			haveSize = ex.Size >= 0
		case infoBlockSize:
			if len(d) != 14 {
				return Export{}, fmt.Errorf("%w: NBD_INFO_BLOCK_SIZE of %d bytes", ErrProtocol, len(d))
			}
			ex.MinBlock = binary.BigEndian.Uint32(d[2:])
			ex.PreferredBlock = binary.BigEndian.Uint32(d[6:])
			ex.MaxBlock = binary.BigEndian.Uint32(d[10:])
		}
	}
}

// ctxErr is err, or ctx's error when ctx ended (the deadline it set cut err short).
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

func sendOption(w io.Writer, option uint32, data []byte) error {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 16+len(data)), magicOption)
	b = binary.BigEndian.AppendUint32(b, option)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	_, err := w.Write(append(b, data...))
	return err
}

type optionReply struct {
	typ  uint32
	data []byte
}

// maxOptionReply bounds an option reply's data: no reply this client asks for comes near it.
const maxOptionReply = 64 << 10

func readOptionReply(r io.Reader, option uint32) (optionReply, error) {
	var b [20]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return optionReply{}, fmt.Errorf("read the NBD server's option reply: %w", err)
	}
	if m := binary.BigEndian.Uint64(b[0:]); m != magicOptionReply {
		return optionReply{}, fmt.Errorf("%w: option reply magic %#x", ErrProtocol, m)
	}
	if got := binary.BigEndian.Uint32(b[8:]); got != option {
		return optionReply{}, fmt.Errorf("%w: a reply to option %d, want %d", ErrProtocol, got, option)
	}
	n := binary.BigEndian.Uint32(b[16:])
	if n > maxOptionReply {
		return optionReply{}, fmt.Errorf("%w: an option reply of %d bytes", ErrProtocol, n)
	}
	rep := optionReply{typ: binary.BigEndian.Uint32(b[12:]), data: make([]byte, n)}
	if _, err := io.ReadFull(r, rep.data); err != nil {
		return optionReply{}, fmt.Errorf("read the NBD server's option reply: %w", err)
	}
	return rep, nil
}

func optionError(option string, rep optionReply) *OptionError {
	return &OptionError{Option: option, Reply: ReplyType(rep.typ), Message: string(rep.data)}
}
