package nbdclient

import (
	"fmt"
	"syscall"
)

// Wire values, from the NBD protocol (NetworkBlockDevice/nbd doc/proto.md).
const (
	magicInit            = 0x4e42444d41474943 // "NBDMAGIC"
	magicOption          = 0x49484156454f5054 // "IHAVEOPT"
	magicOptionReply     = 0x3e889045565a9
	magicRequest         = 0x25609513
	magicSimpleReply     = 0x67446698
	magicStructuredReply = 0x668e33ef

	handshakeFixedNewstyle = 1 << 0
	handshakeNoZeroes      = 1 << 1

	optAbort    = 2
	optStartTLS = 5
	optInfo     = 6
	optGo       = 7

	repAck  = 1
	repInfo = 3

	infoExport    = 0
	infoBlockSize = 3

	cmdRead  = 0
	cmdWrite = 1
	cmdDisc  = 2
	cmdFlush = 3
	cmdTrim  = 4

	cmdWriteZeroes = 6
)

// Transmission flags of an export (Export.Flags).
const (
	FlagHasFlags        = 1 << 0
	FlagReadOnly        = 1 << 1
	FlagSendFlush       = 1 << 2
	FlagSendFUA         = 1 << 3
	FlagRotational      = 1 << 4
	FlagSendTrim        = 1 << 5
	FlagSendWriteZeroes = 1 << 6
	FlagCanMultiConn    = 1 << 8
)

// MaxRequest is the largest request this client sends, the largest the NBD protocol asks every
// server to take (32 MiB); a longer read or write is cut into requests of at most this, or of
// the export's maximum block size when it names a smaller one.
const MaxRequest = 32 << 20

// Export is what the server told of the export the client selected.
type Export struct {
	Name string
	Size int64
	// Flags are the transmission flags (FlagReadOnly, FlagCanMultiConn, ...).
	Flags uint16
	// MinBlock, PreferredBlock and MaxBlock are NBD_INFO_BLOCK_SIZE's; 0 when the server did
	// not send it.
	MinBlock, PreferredBlock, MaxBlock uint32
}

// ReadOnly: the server takes no write.
func (e Export) ReadOnly() bool { return e.Flags&FlagReadOnly != 0 }

// CanFlush: the server takes NBD_CMD_FLUSH.
func (e Export) CanFlush() bool { return e.Flags&FlagSendFlush != 0 }

// CanTrim: the server takes NBD_CMD_TRIM.
func (e Export) CanTrim() bool { return e.Flags&FlagSendTrim != 0 }

// CanWriteZeroes: the server takes NBD_CMD_WRITE_ZEROES.
func (e Export) CanWriteZeroes() bool { return e.Flags&FlagSendWriteZeroes != 0 }

// CanMultiConn: several connections to the export see one another's writes, and a flush on
// one covers the writes answered on all.
func (e Export) CanMultiConn() bool { return e.Flags&FlagCanMultiConn != 0 }

// maxRequest is the longest request to send to e.
func (e Export) maxRequest() int {
	if e.MaxBlock > 0 && e.MaxBlock < MaxRequest {
		return int(e.MaxBlock)
	}
	return MaxRequest
}

// ReplyType is the type of an option's error reply.
type ReplyType uint32

// Error replies of the negotiation.
const (
	ReplyUnsupported       ReplyType = 1<<31 | 1
	ReplyPolicy            ReplyType = 1<<31 | 2
	ReplyInvalid           ReplyType = 1<<31 | 3
	ReplyPlatform          ReplyType = 1<<31 | 4
	ReplyTLSRequired       ReplyType = 1<<31 | 5
	ReplyUnknown           ReplyType = 1<<31 | 6
	ReplyShutdown          ReplyType = 1<<31 | 7
	ReplyBlockSizeRequired ReplyType = 1<<31 | 8
	ReplyTooBig            ReplyType = 1<<31 | 9
)

func (r ReplyType) String() string {
	switch r {
	case ReplyUnsupported:
		return "unsupported"
	case ReplyPolicy:
		return "refused by policy"
	case ReplyInvalid:
		return "invalid"
	case ReplyPlatform:
		return "not supported on this platform"
	case ReplyTLSRequired:
		return "TLS required"
	case ReplyUnknown:
		return "no such export"
	case ReplyShutdown:
		return "server shutting down"
	case ReplyBlockSizeRequired:
		return "block size required"
	case ReplyTooBig:
		return "too big"
	}
	return fmt.Sprintf("error %#x", uint32(r))
}

// OptionError is the server's error reply to a negotiation option: Reply says which error,
// Message is the server's words.
type OptionError struct {
	Option  string
	Reply   ReplyType
	Message string
}

func (e *OptionError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("the NBD server refused %s: %s", e.Option, e.Reply)
	}
	return fmt.Sprintf("the NBD server refused %s (%s): %s", e.Option, e.Reply, e.Message)
}

// Errno is the server's error reply to a request. Its values are Linux's errno numbers
// (the protocol's EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN).
type Errno uint32

func (e Errno) Error() string { return "NBD server: " + syscall.Errno(e).Error() }

// Syscall is the errno to report to a local caller.
func (e Errno) Syscall() syscall.Errno { return syscall.Errno(e) }
