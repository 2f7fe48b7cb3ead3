package nbd

import (
	"encoding/binary"
	"errors"

	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// Wire values from the NBD protocol (NetworkBlockDevice/nbd doc/proto.md). Magic numbers and the
// few IDs go-nbd defines come from its protocol package; the rest are written out here.
const (
	magicInit          = protocol.NEGOTIATION_MAGIC_OLDSTYLE // "NBDMAGIC"
	magicOption        = protocol.NEGOTIATION_MAGIC_OPTION   // "IHAVEOPT"
	magicOptionReply   = protocol.NEGOTIATION_MAGIC_REPLY
	magicRequest       = protocol.TRANSMISSION_MAGIC_REQUEST
	magicSimpleReply   = protocol.TRANSMISSION_MAGIC_REPLY
	requestHeaderSize  = 28
	replyHeaderSize    = 16
	optionHeaderSize   = 16
	maxOptionLength    = 64 << 10 // longer options are discarded and answered NBD_REP_ERR_TOO_BIG
	maxStringLength    = 4096     // proto.md: names and messages MUST be no longer than 4096 bytes
	reservedZeroesSize = 124
)

// Handshake flags (server) and client flags.
const (
	flagFixedNewstyle   = protocol.NEGOTIATION_HANDSHAKE_FLAG_FIXED_NEWSTYLE
	flagNoZeroes        = uint16(1 << 1)
	clientFixedNewstyle = uint32(1 << 0)
	clientNoZeroes      = uint32(1 << 1)
	knownClientFlags    = clientFixedNewstyle | clientNoZeroes
)

// Options.
const (
	optExportName = uint32(1)
	optAbort      = protocol.NEGOTIATION_ID_OPTION_ABORT
	optList       = protocol.NEGOTIATION_ID_OPTION_LIST
	optInfo       = protocol.NEGOTIATION_ID_OPTION_INFO
	optGo         = protocol.NEGOTIATION_ID_OPTION_GO
	optStartTLS   = uint32(5)
)

// Option reply types.
const (
	repAck          = protocol.NEGOTIATION_TYPE_REPLY_ACK
	repServer       = protocol.NEGOTIATION_TYPE_REPLY_SERVER
	repInfo         = protocol.NEGOTIATION_TYPE_REPLY_INFO
	repErrUnsup     = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNSUPPORTED
	repErrPolicy    = uint32(1<<31 | 2)
	repErrInvalid   = uint32(1<<31 | 3)
	repErrUnknown   = protocol.NEGOTIATION_TYPE_REPLY_ERR_UNKNOWN
	repErrTLSReqd   = uint32(1<<31 | 5)
	repErrShutdown  = uint32(1<<31 | 7)
	repErrTooBig    = uint32(1<<31 | 9)
	infoExport      = protocol.NEGOTIATION_TYPE_INFO_EXPORT
	infoName        = protocol.NEGOTIATION_TYPE_INFO_NAME
	infoDescription = protocol.NEGOTIATION_TYPE_INFO_DESCRIPTION
	infoBlockSize   = protocol.NEGOTIATION_TYPE_INFO_BLOCKSIZE
)

// Transmission flags.
const (
	transmitHasFlags        = protocol.NEGOTIATION_REPLY_FLAGS_HAS_FLAGS
	transmitReadOnly        = uint16(1 << 1)
	transmitSendFlush       = uint16(1 << 2)
	transmitSendFUA         = uint16(1 << 3)
	transmitSendTrim        = uint16(1 << 5)
	transmitSendWriteZeroes = uint16(1 << 6)
	transmitCanMultiConn    = protocol.NEGOTIATION_REPLY_FLAGS_CAN_MULTI_CONN
)

// Block sizes advertised in NBD_INFO_BLOCK_SIZE. MaxRequestLength also bounds READ and WRITE.
const (
	MinBlockSize       = 1
	PreferredBlockSize = 4096
	MaxRequestLength   = 32 << 20
)

// Commands and command flags.
const (
	cmdRead        = protocol.TRANSMISSION_TYPE_REQUEST_READ
	cmdWrite       = protocol.TRANSMISSION_TYPE_REQUEST_WRITE
	cmdDisc        = protocol.TRANSMISSION_TYPE_REQUEST_DISC
	cmdFlush       = uint16(3)
	cmdTrim        = uint16(4)
	cmdWriteZeroes = uint16(6)

	cmdFlagFUA    = uint16(1 << 0)
	cmdFlagNoHole = uint16(1 << 1)
)

// NBD error values (the only ones the protocol allows on the wire).
const (
	errnoPerm     = protocol.TRANSMISSION_ERROR_EPERM
	errnoIO       = uint32(5)
	errnoNoMem    = uint32(12)
	errnoInval    = protocol.TRANSMISSION_ERROR_EINVAL
	errnoNoSpace  = uint32(28)
	errnoOverflow = uint32(75)
	errnoNotSup   = uint32(95)
	errnoShutdown = uint32(108)
)

// requestHeader is a decoded NBD request (the 28 bytes before any WRITE payload).
type requestHeader struct {
	flags  uint16
	cmd    uint16
	handle uint64
	offset uint64
	length uint32
}

var errBadRequestMagic = errors.New("nbd: bad request magic")

// parseRequestHeader decodes a request header. A bad magic means the stream is out of sync.
func parseRequestHeader(b *[requestHeaderSize]byte) (requestHeader, error) {
	if binary.BigEndian.Uint32(b[0:4]) != magicRequest {
		return requestHeader{}, errBadRequestMagic
	}
	return requestHeader{
		flags:  binary.BigEndian.Uint16(b[4:6]),
		cmd:    binary.BigEndian.Uint16(b[6:8]),
		handle: binary.BigEndian.Uint64(b[8:16]),
		offset: binary.BigEndian.Uint64(b[16:24]),
		length: binary.BigEndian.Uint32(b[24:28]),
	}, nil
}

// hasPayload reports whether the client sends length bytes after this header.
func (h requestHeader) hasPayload() bool { return h.cmd == cmdWrite }

// check decides whether a request may reach the Export. It returns 0 if so, else the NBD error to
// reply with. No request it rejects touches the Export; every request it accepts lies inside
// [0, size) and is no longer than MaxRequestLength if it moves data.
func (h requestHeader) check(size int64, readOnly bool) uint32 {
	var allowedFlags uint16
	switch h.cmd {
	case cmdRead, cmdFlush:
		allowedFlags = cmdFlagFUA // proto.md: FUA is valid on every command once SEND_FUA is advertised
	case cmdWrite, cmdTrim:
		allowedFlags = cmdFlagFUA
	case cmdWriteZeroes:
		allowedFlags = cmdFlagFUA | cmdFlagNoHole
	default:
		return errnoInval
	}
	if h.flags&^allowedFlags != 0 {
		return errnoInval
	}
	if h.cmd == cmdFlush {
		return 0
	}
	if readOnly && h.cmd != cmdRead {
		return errnoPerm
	}
	if h.length == 0 {
		return errnoInval
	}
	if (h.cmd == cmdRead || h.cmd == cmdWrite) && h.length > MaxRequestLength {
		return errnoInval
	}
	if size < 0 || h.offset > uint64(size) || uint64(h.length) > uint64(size)-h.offset {
		if h.cmd == cmdWrite || h.cmd == cmdWriteZeroes {
			return errnoNoSpace
		}
		return errnoInval
	}
	return 0
}

// infoRequest is the payload of NBD_OPT_INFO and NBD_OPT_GO.
type infoRequest struct {
	name  string
	infos []uint16
}

var errBadInfoRequest = errors.New("malformed NBD_OPT_INFO/NBD_OPT_GO payload")

// parseInfoRequest decodes: 32-bit name length, name, 16-bit count, count 16-bit info types.
func parseInfoRequest(data []byte) (infoRequest, error) {
	if len(data) < 6 {
		return infoRequest{}, errBadInfoRequest
	}
	nameLen := binary.BigEndian.Uint32(data[0:4])
	if nameLen > maxStringLength || uint64(nameLen)+6 > uint64(len(data)) {
		return infoRequest{}, errBadInfoRequest
	}
	rest := data[4+nameLen:]
	count := int(binary.BigEndian.Uint16(rest[0:2]))
	rest = rest[2:]
	if len(rest) != 2*count {
		return infoRequest{}, errBadInfoRequest
	}
	req := infoRequest{name: string(data[4 : 4+nameLen])}
	if count > 0 {
		req.infos = make([]uint16, count)
		for i := range req.infos {
			req.infos[i] = binary.BigEndian.Uint16(rest[2*i:])
		}
	}
	return req, nil
}

func (r infoRequest) wants(info uint16) bool {
	for _, i := range r.infos {
		if i == info {
			return true
		}
	}
	return false
}
