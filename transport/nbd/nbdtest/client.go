package nbdtest

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/replvol/replvol/internal/lockorder"
)

// Wire values, written out from NetworkBlockDevice/nbd doc/proto.md.
const (
	MagicInit        = 0x4e42444d41474943 // "NBDMAGIC"
	MagicOption      = 0x49484156454f5054 // "IHAVEOPT"
	MagicOptionReply = 0x3e889045565a9
	MagicRequest     = 0x25609513
	MagicSimpleReply = 0x67446698

	HandshakeFixedNewstyle = 1 << 0
	HandshakeNoZeroes      = 1 << 1
	ClientFixedNewstyle    = 1 << 0
	ClientNoZeroes         = 1 << 1

	OptExportName     = 1
	OptAbort          = 2
	OptList           = 3
	OptStartTLS       = 5
	OptInfo           = 6
	OptGo             = 7
	OptStructuredRepl = 8

	RepAck         = 1
	RepServer      = 2
	RepInfo        = 3
	RepErrUnsup    = 1<<31 | 1
	RepErrPolicy   = 1<<31 | 2
	RepErrInvalid  = 1<<31 | 3
	RepErrTLSReqd  = 1<<31 | 5
	RepErrUnknown  = 1<<31 | 6
	RepErrShutdown = 1<<31 | 7
	RepErrTooBig   = 1<<31 | 9

	InfoExport      = 0
	InfoName        = 1
	InfoDescription = 2
	InfoBlockSize   = 3

	FlagHasFlags        = 1 << 0
	FlagReadOnly        = 1 << 1
	FlagSendFlush       = 1 << 2
	FlagSendFUA         = 1 << 3
	FlagSendTrim        = 1 << 5
	FlagSendWriteZeroes = 1 << 6
	FlagCanMultiConn    = 1 << 8

	CmdRead        = 0
	CmdWrite       = 1
	CmdDisc        = 2
	CmdFlush       = 3
	CmdTrim        = 4
	CmdCache       = 5
	CmdWriteZeroes = 6
	CmdBlockStatus = 7

	CmdFlagFUA      = 1 << 0
	CmdFlagNoHole   = 1 << 1
	CmdFlagDF       = 1 << 2
	CmdFlagFastZero = 1 << 4
)

// Errno is an NBD error value from a reply.
type Errno uint32

// NBD error values.
const (
	EPERM     Errno = 1
	EIO       Errno = 5
	ENOMEM    Errno = 12
	EINVAL    Errno = 22
	ENOSPC    Errno = 28
	EOVERFLOW Errno = 75
	ENOTSUP   Errno = 95
	ESHUTDOWN Errno = 108
)

func (e Errno) Error() string {
	names := map[Errno]string{EPERM: "EPERM", EIO: "EIO", ENOMEM: "ENOMEM", EINVAL: "EINVAL",
		ENOSPC: "ENOSPC", EOVERFLOW: "EOVERFLOW", ENOTSUP: "ENOTSUP", ESHUTDOWN: "ESHUTDOWN"}
	if n, ok := names[e]; ok {
		return "nbd error " + n
	}
	return fmt.Sprintf("nbd error %d", uint32(e))
}

// OptionError is a negotiation error reply.
type OptionError struct {
	Option, Type uint32
	Message      string
}

func (e *OptionError) Error() string {
	return fmt.Sprintf("option %d: error reply %#x: %s", e.Option, e.Type, e.Message)
}

// ---- negotiation ----

// Handshake is a connection in the negotiation phase.
type Handshake struct {
	Conn           net.Conn
	r              *bufio.Reader
	HandshakeFlags uint16
	clientFlags    uint32
}

// OptionReply is one reply to an option.
type OptionReply struct {
	Option, Type uint32
	Data         []byte
}

// Greet reads the server's greeting and sends clientFlags.
func Greet(conn net.Conn, clientFlags uint32) (*Handshake, error) {
	h := &Handshake{Conn: conn, r: bufio.NewReader(conn), clientFlags: clientFlags}
	var b [18]byte
	if _, err := io.ReadFull(h.r, b[:]); err != nil {
		return nil, fmt.Errorf("read greeting: %w", err)
	}
	if binary.BigEndian.Uint64(b[0:]) != MagicInit || binary.BigEndian.Uint64(b[8:]) != MagicOption {
		return nil, fmt.Errorf("bad greeting %x", b)
	}
	h.HandshakeFlags = binary.BigEndian.Uint16(b[16:])
	if _, err := conn.Write(binary.BigEndian.AppendUint32(nil, clientFlags)); err != nil {
		return nil, err
	}
	return h, nil
}

// SendOption sends an option with its data.
func (h *Handshake) SendOption(option uint32, data []byte) error {
	b := binary.BigEndian.AppendUint64(nil, MagicOption)
	b = binary.BigEndian.AppendUint32(b, option)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	_, err := h.Conn.Write(append(b, data...))
	return err
}

// ReadReply reads one option reply.
func (h *Handshake) ReadReply() (OptionReply, error) {
	var b [20]byte
	if _, err := io.ReadFull(h.r, b[:]); err != nil {
		return OptionReply{}, err
	}
	if m := binary.BigEndian.Uint64(b[0:]); m != MagicOptionReply {
		return OptionReply{}, fmt.Errorf("bad option reply magic %#x", m)
	}
	rep := OptionReply{Option: binary.BigEndian.Uint32(b[8:]), Type: binary.BigEndian.Uint32(b[12:])}
	rep.Data = make([]byte, binary.BigEndian.Uint32(b[16:]))
	if _, err := io.ReadFull(h.r, rep.Data); err != nil {
		return OptionReply{}, err
	}
	return rep, nil
}

// StartTLS sends NBD_OPT_STARTTLS and, when the server acknowledges it, runs the TLS handshake
// with cfg and goes on over TLS: Conn becomes the *tls.Conn. An error reply is returned as
// *OptionError and the handshake goes on in plaintext; a failed TLS handshake is returned as
// it is (the connection is then of no more use).
func (h *Handshake) StartTLS(cfg *tls.Config) error {
	if err := h.SendOption(OptStartTLS, nil); err != nil {
		return err
	}
	rep, err := h.ReadReply()
	if err != nil {
		return err
	}
	if rep.Option != OptStartTLS {
		return fmt.Errorf("reply for option %d, want %d", rep.Option, OptStartTLS)
	}
	if rep.Type != RepAck {
		return &OptionError{Option: OptStartTLS, Type: rep.Type, Message: string(rep.Data)}
	}
	if n := h.r.Buffered(); n > 0 {
		return fmt.Errorf("%d bytes from the server after its NBD_OPT_STARTTLS reply, before TLS", n)
	}
	t := tls.Client(h.Conn, cfg)
	if err := t.Handshake(); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	h.Conn, h.r = t, bufio.NewReader(t)
	return nil
}

// InfoPayload encodes the data of NBD_OPT_INFO / NBD_OPT_GO.
func InfoPayload(name string, infos ...uint16) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(infos)))
	for _, i := range infos {
		b = binary.BigEndian.AppendUint16(b, i)
	}
	return b
}

// ExportInfo is what NBD_OPT_INFO / NBD_OPT_GO / NBD_OPT_EXPORT_NAME told about an export.
type ExportInfo struct {
	Size                               int64
	Flags                              uint16
	Name, Description                  string
	HasBlockSize                       bool
	MinBlock, PreferredBlock, MaxBlock uint32
	Replies                            []OptionReply // every reply, in order, ending with the ACK
}

// Info sends NBD_OPT_INFO or NBD_OPT_GO (option) and collects replies up to the final one. An
// error reply is returned as *OptionError.
func (h *Handshake) Info(option uint32, name string, infos ...uint16) (ExportInfo, error) {
	if err := h.SendOption(option, InfoPayload(name, infos...)); err != nil {
		return ExportInfo{}, err
	}
	var info ExportInfo
	for {
		rep, err := h.ReadReply()
		if err != nil {
			return info, err
		}
		info.Replies = append(info.Replies, rep)
		if rep.Option != option {
			return info, fmt.Errorf("reply for option %d, want %d", rep.Option, option)
		}
		switch {
		case rep.Type == RepAck:
			return info, nil
		case rep.Type&(1<<31) != 0:
			return info, &OptionError{Option: option, Type: rep.Type, Message: string(rep.Data)}
		case rep.Type != RepInfo || len(rep.Data) < 2:
			return info, fmt.Errorf("unexpected reply type %#x len %d", rep.Type, len(rep.Data))
		}
		d := rep.Data
		switch binary.BigEndian.Uint16(d) {
		case InfoExport:
			if len(d) != 12 {
				return info, fmt.Errorf("NBD_INFO_EXPORT length %d", len(d))
			}
			info.Size = int64(binary.BigEndian.Uint64(d[2:]))
			info.Flags = binary.BigEndian.Uint16(d[10:])
		case InfoName:
			info.Name = string(d[2:])
		case InfoDescription:
			info.Description = string(d[2:])
		case InfoBlockSize:
			if len(d) != 14 {
				return info, fmt.Errorf("NBD_INFO_BLOCK_SIZE length %d", len(d))
			}
			info.HasBlockSize = true
			info.MinBlock = binary.BigEndian.Uint32(d[2:])
			info.PreferredBlock = binary.BigEndian.Uint32(d[6:])
			info.MaxBlock = binary.BigEndian.Uint32(d[10:])
		}
	}
}

// Go selects the export with NBD_OPT_GO and enters transmission.
func (h *Handshake) Go(name string, infos ...uint16) (*Client, ExportInfo, error) {
	info, err := h.Info(OptGo, name, infos...)
	if err != nil {
		return nil, info, err
	}
	return h.client(info), info, nil
}

// ExportName selects the export with NBD_OPT_EXPORT_NAME and enters transmission.
func (h *Handshake) ExportName(name string) (*Client, ExportInfo, error) {
	if err := h.SendOption(OptExportName, []byte(name)); err != nil {
		return nil, ExportInfo{}, err
	}
	n := 10
	if h.clientFlags&ClientNoZeroes == 0 {
		n += 124
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(h.r, b); err != nil {
		return nil, ExportInfo{}, err
	}
	info := ExportInfo{Size: int64(binary.BigEndian.Uint64(b)), Flags: binary.BigEndian.Uint16(b[8:])}
	return h.client(info), info, nil
}

// List sends NBD_OPT_LIST and returns the export names.
func (h *Handshake) List() ([]string, error) {
	if err := h.SendOption(OptList, nil); err != nil {
		return nil, err
	}
	var names []string
	for {
		rep, err := h.ReadReply()
		if err != nil {
			return names, err
		}
		switch rep.Type {
		case RepAck:
			return names, nil
		case RepServer:
			if len(rep.Data) < 4 || int(binary.BigEndian.Uint32(rep.Data)) > len(rep.Data)-4 {
				return names, fmt.Errorf("bad NBD_REP_SERVER %x", rep.Data)
			}
			names = append(names, string(rep.Data[4:4+binary.BigEndian.Uint32(rep.Data)]))
		default:
			return names, &OptionError{Option: OptList, Type: rep.Type, Message: string(rep.Data)}
		}
	}
}

func (h *Handshake) client(info ExportInfo) *Client {
	return &Client{Conn: h.Conn, r: h.r, Info: info, pending: make(map[uint64]uint32), nextHandle: 1}
}

// ---- transmission ----

// Client is a connection in the transmission phase. Send and Receive pipeline, and may be called
// from two goroutines (one sending, one receiving); the other methods send one request and wait
// for its reply, and are for one goroutine.
type Client struct {
	Conn net.Conn
	r    *bufio.Reader
	Info ExportInfo

	mu         lockorder.Mutex
	pending    map[uint64]uint32 // handle -> READ length expected on success (0 otherwise)
	nextHandle uint64
}

// Dial connects to addr and selects export name with NBD_OPT_GO.
func Dial(ctx context.Context, addr, name string) (*Client, error) {
	return DialTLS(ctx, addr, name, nil)
}

// DialTLS is Dial with NBD_OPT_STARTTLS first, when cfg is not nil.
func DialTLS(ctx context.Context, addr, name string, cfg *tls.Config) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	h, err := Greet(conn, ClientFixedNewstyle|ClientNoZeroes)
	if err == nil && cfg != nil {
		err = h.StartTLS(cfg)
	}
	if err == nil {
		var c *Client
		if c, _, err = h.Go(name, InfoBlockSize); err == nil {
			_ = conn.SetDeadline(time.Time{})
			return c, nil
		}
	}
	conn.Close()
	return nil, err
}

// Close closes the connection without NBD_CMD_DISC.
func (c *Client) Close() error { return c.Conn.Close() }

// Request is one request. Payload, if not nil, is sent after the header whatever the command
// (so tests can lie about lengths); Handle 0 means "pick the next one".
type Request struct {
	Flags, Type    uint16
	Handle, Offset uint64
	Length         uint32
	Payload        []byte
}

// Reply is one simple reply.
type Reply struct {
	Handle uint64
	Errno  Errno
	Data   []byte
}

// Send writes req and remembers it, so that Receive knows whether data follows its reply.
func (c *Client) Send(req Request) (handle uint64, err error) {
	c.mu.Lock()
	if req.Handle == 0 {
		req.Handle = c.nextHandle
		c.nextHandle++
	}
	b := make([]byte, 28, 28+len(req.Payload))
	binary.BigEndian.PutUint32(b[0:], MagicRequest)
	binary.BigEndian.PutUint16(b[4:], req.Flags)
	binary.BigEndian.PutUint16(b[6:], req.Type)
	binary.BigEndian.PutUint64(b[8:], req.Handle)
	binary.BigEndian.PutUint64(b[16:], req.Offset)
	binary.BigEndian.PutUint32(b[24:], req.Length)
	var readLength uint32
	if req.Type == CmdRead {
		readLength = req.Length
	}
	if req.Type != CmdDisc {
		c.pending[req.Handle] = readLength
	}
	c.mu.Unlock()
	_, err = c.Conn.Write(append(b, req.Payload...))
	return req.Handle, err
}

// SendRaw writes bytes as they are.
func (c *Client) SendRaw(b []byte) error {
	_, err := c.Conn.Write(b)
	return err
}

// Receive reads one reply (and, for a successful READ, its data).
func (c *Client) Receive() (Reply, error) {
	var b [16]byte
	if _, err := io.ReadFull(c.r, b[:]); err != nil {
		return Reply{}, err
	}
	if m := binary.BigEndian.Uint32(b[0:]); m != MagicSimpleReply {
		return Reply{}, fmt.Errorf("bad reply magic %#x", m)
	}
	rep := Reply{Errno: Errno(binary.BigEndian.Uint32(b[4:])), Handle: binary.BigEndian.Uint64(b[8:])}
	c.mu.Lock()
	readLength, ok := c.pending[rep.Handle]
	delete(c.pending, rep.Handle)
	c.mu.Unlock()
	if !ok {
		return rep, fmt.Errorf("reply for unknown handle %d", rep.Handle)
	}
	if rep.Errno == 0 && readLength > 0 {
		rep.Data = make([]byte, readLength)
		if _, err := io.ReadFull(c.r, rep.Data); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// Pending is the number of requests sent and not yet answered.
func (c *Client) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// Do sends req and waits for its reply; an error reply is returned as an Errno.
func (c *Client) Do(req Request) (Reply, error) {
	handle, err := c.Send(req)
	if err != nil {
		return Reply{}, err
	}
	rep, err := c.Receive()
	if err != nil {
		return rep, err
	}
	if rep.Handle != handle {
		return rep, fmt.Errorf("reply handle %d, want %d", rep.Handle, handle)
	}
	if rep.Errno != 0 {
		return rep, rep.Errno
	}
	return rep, nil
}

// Read reads length bytes at off.
func (c *Client) Read(off uint64, length uint32) ([]byte, error) {
	rep, err := c.Do(Request{Type: CmdRead, Offset: off, Length: length})
	return rep.Data, err
}

// Write writes p at off with command flags (e.g. CmdFlagFUA).
func (c *Client) Write(off uint64, p []byte, flags uint16) error {
	_, err := c.Do(Request{Type: CmdWrite, Flags: flags, Offset: off, Length: uint32(len(p)), Payload: p})
	return err
}

// Flush sends NBD_CMD_FLUSH.
func (c *Client) Flush() error {
	_, err := c.Do(Request{Type: CmdFlush})
	return err
}

// Trim sends NBD_CMD_TRIM.
func (c *Client) Trim(off uint64, length uint32, flags uint16) error {
	_, err := c.Do(Request{Type: CmdTrim, Flags: flags, Offset: off, Length: length})
	return err
}

// WriteZeroes sends NBD_CMD_WRITE_ZEROES.
func (c *Client) WriteZeroes(off uint64, length uint32, flags uint16) error {
	_, err := c.Do(Request{Type: CmdWriteZeroes, Flags: flags, Offset: off, Length: length})
	return err
}

// Disconnect sends NBD_CMD_DISC, reads the replies to requests still pending, and waits for the
// server to close the connection. It returns the replies it read.
func (c *Client) Disconnect() ([]Reply, error) {
	if _, err := c.Send(Request{Type: CmdDisc}); err != nil {
		return nil, err
	}
	var replies []Reply
	for c.Pending() > 0 {
		rep, err := c.Receive()
		if err != nil {
			return replies, err
		}
		replies = append(replies, rep)
	}
	if err := c.WaitClosed(); err != nil {
		return replies, err
	}
	return replies, c.Conn.Close()
}

// WaitClosed reads until the server closes the connection; anything received is an error.
func (c *Client) WaitClosed() error {
	var b [1]byte
	n, err := c.r.Read(b[:])
	if n > 0 {
		return fmt.Errorf("unexpected byte %#x from server", b[0])
	}
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
